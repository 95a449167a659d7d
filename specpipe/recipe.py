"""Strategies and recipes: compositions as data, turned into the overrides a user would type.

A strategy (`strategies/NAME.yaml`, `strategy=NAME|PATH`) is a flat mapping of settings, the
same key=value pairs that follow `specpipe generate`:

    about: prompt lookup, γ picked by the cost model
    proposer: ngram
    proposer.ngram_max: 4
    controller: cost

A recipe (`recipes/<model>/specpipe.yaml`, `<model dir>/specpipe.yaml`, `recipe=PATH`) is a
strategy tuned for one target, with its artifacts and the figures measured with it:

    specpipe_recipe: 1
    target: smollm2-135m          # zoo name, hub id or path; "." is the folder of the recipe
    strategy: {proposer: ngram, controller: cost, gamma: 4}
    artifacts: {heads: medusa}    # paths inside the recipe's folder; used as "artifact:heads"
    measured: {...}               # figures from `specpipe tune` or `train` (MEASURED: the keys
                                  # specpipe reads are typed; the others are free-form data)
    versions: {...}

Both are data from a stranger: keys are checked against the schema here (unknown ones refused by
name), values must be scalars or lists of scalars (the two mappings, `batch_schedule` and
`proposer.tree`, are checked apart), a `_target_` outside `specpipe.` is refused, no value may
hold an interpolation (`${...}`: Hydra would resolve it, e.g. read an environment variable), and
every path the file supplies (artifacts, `target`, models, heads, anything path-shaped) must
stay inside the file's folder unless it is a zoo name or a hub id (those two rules: stranger.py).
What remains becomes Hydra overrides placed before the user's own, so the user's settings win
and Hydra checks the rest.
The `measured` block is checked against measured.py's MEASURED, the one schema of the figures
that check, generate and export read from it: a malformed one is refused by name like any other
part of a recipe (never read letter by letter, nor as a GPU because it is not "cpu").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specpipe.errors import SpecpipeError
from specpipe.measured import check_measured
from specpipe.paths import shipped_dir
from specpipe.stranger import confine, refuse_interpolation

RECIPE_FILE = "specpipe.yaml"
RECIPE_VERSION = 1
RECIPE_KEYS = {"specpipe_recipe", "target", "strategy", "artifacts", "measured", "versions", "about"}
GROUPS = ("proposer", "verifier", "controller")
TOP_KEYS = {"gamma", "gamma_min", "gamma_max", "temperature", "top_k", "top_p", "model.quantize", "model.chat",
            "batch_schedule", "guard"}
_OPTION = re.compile(r"^(proposer|verifier|controller)\.[A-Za-z_][A-Za-z0-9_]*$")
_CHOICE = re.compile(r"^[A-Za-z0-9_.-]+$")
ARTIFACT = "artifact:"


@dataclass
class Recipe:
    path: Path  # the recipe file
    target: str
    strategy: dict
    artifacts: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    about: str = ""

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def model(self) -> str:
        """The target as `model=` takes it: a zoo name, a hub id, or a path inside the recipe's
        folder ("." is the folder). A target outside it is never opened on the recipe's word."""
        return confine("target", self.target, self.folder, str(self.path),
                       fix="or pass model=PATH yourself (your own settings are trusted)")

    def is_for(self, model: str) -> bool:
        """Whether `model=` (the user's) names this recipe's target."""
        if model == self.target:
            return True
        here = Path(model).expanduser().resolve()
        return here in ((self.folder / self.target).resolve(), Path(self.target).expanduser().resolve())


def _read_yaml(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecpipeError(f"The {what} {path} cannot be read: {str(err).splitlines()[0]}. Fix the "
                            "file (YAML), or point at another one.") from None
    if not isinstance(data, dict):
        raise SpecpipeError(f"The {what} {path} is not a YAML mapping of settings (key: value).")
    return data


def check_strategy(mapping: dict, where: str, folder: Path | None = None, *, allow_about: bool = True) -> dict:
    """A validated copy of a flat strategy mapping; anything unknown or unsafe is refused by name.
    `folder`: the file's folder, where its paths must stay (None: our own built-in data)."""
    out = {}
    for key, value in mapping.items():
        if key == "about" and allow_about:
            continue
        if not isinstance(key, str) or not (key in GROUPS or key in TOP_KEYS or _OPTION.match(key)):
            raise SpecpipeError(
                f"{where}: the key {key!r} is not a strategy setting. Allowed: proposer, verifier, "
                f"controller (a choice from conf/), their options (proposer.ngram_max, ...), and "
                f"{', '.join(sorted(TOP_KEYS))}."
            )
        if key in GROUPS and not (isinstance(value, str) and _CHOICE.match(value)):
            raise SpecpipeError(f"{where}: {key}={value!r} must name a file of conf/{key}/ (e.g. {key}=ngram).")
        if key.endswith("._target_") and not (isinstance(value, str) and value.startswith("specpipe.")):
            raise SpecpipeError(
                f"{where}: {key}={value!r} is refused: a strategy or recipe may only name build "
                "functions under `specpipe.`. Delete the key and pick a built-in component by name."
            )
        if key == "batch_schedule":  # the one mapping: batch size -> γ, integers only
            from specpipe.controllers.base import check_schedule

            try:
                value = check_schedule(value)
            except SpecpipeError as err:
                raise SpecpipeError(f"{where}: {err}") from None
        elif key == "proposer.tree" and value is not None:  # the other mapping: EAGLE-2's {top_k: N, nodes: M}
            _check_tree(mapping.get("proposer"), value, where)
        elif not _is_data(value):
            raise SpecpipeError(f"{where}: {key} must be a number, a string, a boolean or a list of those.")
        refuse_interpolation(key, value, where)
        if folder is not None and isinstance(value, str) and not value.startswith(ARTIFACT):
            value = confine(key, value, folder, where)
        out[key] = value
    return out


def _check_tree(proposer, tree, where: str) -> None:
    """A tree option (a mapping, a list of paths or a switch), judged by the proposer the strategy names (its own `validate_options`,
    found through its config: nothing here knows a proposer by name). Without a proposer in the
    strategy, the one the user picks judges it when the config is checked."""
    from specpipe.components import validator_of

    ints = lambda items: all(type(v) is int for v in items)  # noqa: E731
    if not (isinstance(tree, bool) or (isinstance(tree, dict) and ints(tree.values()))
            or (isinstance(tree, list) and all(isinstance(path, list) and ints(path) for path in tree))):
        raise SpecpipeError(f"{where}: proposer.tree={tree!r} must be a mapping of integers (EAGLE-2: "
                            "{top_k: 4, nodes: 16}), a list of paths (Medusa: [[0], [1], [0, 0]]) or true/false")
    validate = validator_of("proposer", proposer) if isinstance(proposer, str) and _CHOICE.match(proposer) else None
    try:
        if validate is not None:
            validate({"tree": tree})
    except SpecpipeError as err:
        raise SpecpipeError(f"{where}: {err}") from None


def _is_data(value) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def strategies_dir() -> Path:
    """strategies/ of a source checkout, or the copy installed inside the package."""
    found = shipped_dir("strategies")
    if found is None:
        raise FileNotFoundError("specpipe's strategies/ directory is missing from this installation")
    return found


def strategy_names() -> list[str]:
    return sorted(p.stem for p in strategies_dir().glob("*.yaml"))


def load_strategy(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if not path.is_file():
        path = strategies_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise SpecpipeError(f"strategy={name_or_path} is neither a file nor a built-in strategy. "
                            f"Built-in: {', '.join(strategy_names())}.")
    return check_strategy(_read_yaml(path, "strategy"), str(path), path.resolve().parent)


def find_recipe(value: str) -> Path:
    """A recipe file, a folder holding specpipe.yaml, or a model name with recipes/<name>/; a
    relative path is looked for from the working directory, then in specpipe's own recipes/ (so
    `recipe=recipes/smollm2-135m`, as the docs write it, works outside a checkout too)."""
    path = Path(value).expanduser()
    shipped = shipped_recipes_dir()
    roots = [Path("recipes")] + ([shipped] if shipped else [])
    inside = [] if path.is_absolute() else [root / _under_recipes(path) for root in roots]
    for candidate in (path, *inside):
        for found in (candidate, candidate / RECIPE_FILE):
            if found.is_file():
                return found.resolve()
    looked = ", ".join(dict.fromkeys(str(p.resolve()) for p in (path, *inside)))
    raise SpecpipeError(f"recipe={value} was not found (looked at {looked}): give a recipe file, a folder holding "
                        f"{RECIPE_FILE}, or a model name with recipes/<name>/{RECIPE_FILE}.")


def _under_recipes(path: Path) -> Path:
    """`recipes/x/y` as `x/y`: a path the docs give from the project's root, looked up in a recipes/ folder."""
    return Path(*path.parts[1:]) if path.parts[:1] == ("recipes",) and len(path.parts) > 1 else path


def shipped_recipes_dir() -> Path | None:
    """recipes/ of this checkout, or the copy installed with the package, if any."""
    return shipped_dir("recipes")


def shipped_recipe(model: str) -> Path | None:
    """recipes/<model>/specpipe.yaml shipped with specpipe (or in the working directory), if any."""
    for root in (shipped_recipes_dir(), Path("recipes")):
        if root is not None and (root / model / RECIPE_FILE).is_file():
            return (root / model / RECIPE_FILE).resolve()
    return None


def load_recipe(value: str | Path) -> Recipe:
    path = find_recipe(str(value))
    data = _read_yaml(path, "recipe")
    unknown = sorted(set(map(str, data)) - RECIPE_KEYS)
    if unknown:
        raise SpecpipeError(f"The recipe {path} has unknown keys {unknown}: a recipe holds only "
                            f"{', '.join(sorted(RECIPE_KEYS))}. Remove them (or fix their spelling).")
    if data.get("specpipe_recipe") != RECIPE_VERSION:
        raise SpecpipeError(f"The recipe {path} says specpipe_recipe={data.get('specpipe_recipe')!r}; this "
                            f"specpipe reads version {RECIPE_VERSION}. Re-run `specpipe tune` to write a new one.")
    if not isinstance(data.get("target"), str) or not isinstance(data.get("strategy"), dict):
        raise SpecpipeError(f"The recipe {path} needs `target:` (a model) and `strategy:` (a mapping of settings).")
    for key in ("artifacts", "measured", "versions"):
        if not isinstance(data.get(key, {}), dict):
            raise SpecpipeError(f"The recipe {path}: `{key}` must be a mapping.")
    refuse_interpolation("target", data["target"], str(path))
    recipe = Recipe(path, data["target"], check_strategy(data["strategy"], str(path), path.parent, allow_about=False),
                    data.get("artifacts", {}), check_measured(data.get("measured") or {}, f"The recipe {path}"),
                    data.get("versions", {}),
                    str(data.get("about", "")))
    _check_artifacts(recipe)
    return recipe


def _check_artifacts(recipe: Recipe) -> None:
    folder = recipe.folder.resolve()
    for name, rel in recipe.artifacts.items():
        if not isinstance(rel, str):
            raise SpecpipeError(f"The recipe {recipe.path}: artifact {name}={rel!r} must be a path (a string) inside "
                                "the recipe's folder.")
        written, target = folder / rel, (folder / rel).resolve()
        if folder not in (target, *target.parents):
            via = f" (it is a symbolic link to {target})" if target != Path(os.path.abspath(written)) else ""
            raise SpecpipeError(f"The recipe {recipe.path}: artifact {name}={rel!r} leads outside the recipe's folder "
                                f"{folder}{via}: an artifact must be a path inside the recipe's folder. Copy the "
                                f"files into it (not a link to them elsewhere: `cp -rL` copies what links point to) "
                                "and name them there.")
        if not target.exists():
            link = (f" is a symbolic link to {os.readlink(written)}, which does not exist" if written.is_symlink()
                    else " does not exist in the recipe's folder")
            raise SpecpipeError(f"The recipe {recipe.path}: artifact {name}={rel!r}{link} ({folder}). Put the files "
                                "there, or fix the path under `artifacts:`.")
        _links_inside(recipe, name, target, folder)
    for key, value in recipe.strategy.items():
        if isinstance(value, str) and value.startswith(ARTIFACT) and value[len(ARTIFACT):] not in recipe.artifacts:
            raise SpecpipeError(f"The recipe {recipe.path}: {key}={value} names no entry of `artifacts`.")


def _links_inside(recipe: Recipe, name: str, artifact: Path, folder: Path) -> None:
    """A file of an artifact folder that is a symbolic link out of the recipe's folder is refused as
    the artifact itself would be: a recipe's files are the ones inside its folder."""
    if not artifact.is_dir():
        return
    for root, dirs, files in os.walk(artifact):
        for entry in (*dirs, *files):
            path = Path(root) / entry
            if path.is_symlink() and folder not in (path.resolve(), *path.resolve().parents):
                raise SpecpipeError(f"The recipe {recipe.path}: artifact {name} holds {path.relative_to(folder)}, a "
                                    f"symbolic link to {path.resolve()}, outside the recipe's folder {folder}: a "
                                    "recipe may use only files inside its folder. Copy the file in place of the link "
                                    "(`cp -rL` copies what links point to).")


def resolve_artifacts(recipe: Recipe) -> dict:
    """The recipe's strategy with "artifact:NAME" values replaced by absolute paths."""
    return with_artifacts(recipe.strategy, recipe.artifacts, recipe.folder)


def with_artifacts(strategy: dict, artifacts: dict, folder: Path) -> dict:
    """"artifact:NAME" values -> absolute paths of artifacts[NAME] inside `folder`."""
    def one(value):
        if isinstance(value, str) and value.startswith(ARTIFACT):
            return str((folder / artifacts[value[len(ARTIFACT):]]).resolve())
        return value

    return {key: one(value) for key, value in strategy.items()}


def as_overrides(mapping: dict) -> list[str]:
    """A validated strategy mapping as Hydra override strings (group choices first)."""
    keys = sorted(mapping, key=lambda k: (k not in GROUPS, k))
    return [f"{k}={mapping[k]}" if k in GROUPS else f"{k}={literal(mapping[k])}" for k in keys]


def literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):  # batch_schedule or proposer.tree (checked: integer values)
        return "{" + ",".join(f"{k}:{int(v)}" for k, v in value.items()) + "}"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_recipe(path: Path, data: dict) -> Path:
    """Write atomically (a temporary file renamed into place): never a half-written recipe."""
    from specpipe.outputs import atomic_write

    return atomic_write(path, lambda f: yaml.safe_dump(data, f, sort_keys=False, allow_unicode=True))
