"""SGLang's own argument definitions, from a released wheel, judging specpipe's exports.

The tests run offline, so they never download SGLang: they look for its wheel in the folder
named by `$SPECPIPE_SGLANG_WHEELS` (filled with `pip download --no-deps --only-binary=:all:
sglang==0.5.23 -d DIR`) and skip without it. Never installed, never imported: SGLang's server
needs a GPU stack to import, so the sources are read from the wheel's zip and parsed with `ast`.

- The flags: `sglang/srt/arg_groups/fields/spec.py` defines the `Spec` namespace of
  `ServerArgs`, and `add_cli_args_from_dataclass` (`sglang/srt/arg_groups/arg_utils.py`) turns
  each field annotated `A[type, "help"]` or `A[type, Arg(...)]` into an argument: `--` and the
  field's name with `-` for `_` (or `Arg(cli_name=...)`), plus `Arg(aliases=[...])`; a field
  without that metadata, or with `Arg(no_cli=True)`, has none. A bool field is a switch
  (`store_true`, or `argparse.BooleanOptionalAction`, which adds `--no-...`); a `Literal[...]`
  field, or an `Arg(choices=[...])` written out in the file, takes only those values.
- The algorithms: the members of `SpeculativeAlgorithm` (`sglang/srt/speculative/spec_info.py`)
  but NONE, plus the reserved aliases of `sglang/srt/speculative/spec_registry.py` (NEXTN).
"""

from __future__ import annotations

import ast
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

SPEC = "sglang/srt/arg_groups/fields/spec.py"
ALGORITHMS = "sglang/srt/speculative/spec_info.py"
REGISTRY = "sglang/srt/speculative/spec_registry.py"


@dataclass(frozen=True)
class Argument:
    """One command-line argument of SGLang's parser: the type of its value ("switch": none, it
    is given bare) and its choices where the source spells them out."""

    field: str
    kind: str  # "switch", "int", "float", "str" or "other"
    choices: tuple | None = None

    def refuses(self, value) -> str | None:
        """Why SGLang's parser would not take `value` for this argument (None: it would)."""
        if self.kind == "switch":
            return None if value is True else f"a switch is given bare (True), not {value!r}"
        if isinstance(value, bool):
            return f"{value!r}: only a switch is written bare"
        if self.kind == "int" and not isinstance(value, int):
            return f"{value!r} is not an int"
        if self.kind == "float" and not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        if self.kind == "str" and not isinstance(value, str):
            return f"{value!r} is not a string"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {list(self.choices)}"
        return None


def wheel(version: str) -> Path | None:
    """The sglang wheel of `version` in $SPECPIPE_SGLANG_WHEELS, if there is one."""
    folder = os.environ.get("SPECPIPE_SGLANG_WHEELS")
    found = sorted(Path(folder).glob(f"sglang-{version}-*.whl")) if folder else []
    return found[0] if found else None


def _source(whl: Path, name: str) -> ast.Module:
    with zipfile.ZipFile(whl) as zf:
        return ast.parse(zf.read(name).decode(), filename=name)


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    found = [node for node in module.body if isinstance(node, ast.ClassDef) and node.name == name]
    assert len(found) == 1, f"no class {name} in the wheel's source: read another file"
    return found[0]


def _strip_optional(kind: ast.expr) -> ast.expr:
    """X of `Optional[X]` (or of `X | None`), else the annotation itself."""
    if isinstance(kind, ast.Subscript) and isinstance(kind.value, ast.Name) and kind.value.id == "Optional":
        return kind.slice
    if isinstance(kind, ast.BinOp) and isinstance(kind.op, ast.BitOr):
        for side, other in ((kind.left, kind.right), (kind.right, kind.left)):
            if isinstance(other, ast.Constant) and other.value is None:
                return side
    return kind


def _argument(field: str, kind: ast.expr, meta: dict) -> Argument:
    kind = _strip_optional(kind)
    choices = meta.get("choices")
    if isinstance(kind, ast.Subscript) and isinstance(kind.value, ast.Name) and kind.value.id == "Literal":
        values = kind.slice.elts if isinstance(kind.slice, ast.Tuple) else [kind.slice]
        literal = tuple(ast.literal_eval(v) for v in values)
        return Argument(field, type(literal[0]).__name__ if literal else "other", choices or literal)
    name = kind.id if isinstance(kind, ast.Name) else None
    if name == "bool" or meta.get("action") == "BooleanOptionalAction":
        return Argument(field, "switch")
    return Argument(field, name if name in ("int", "float", "str") else "other", choices)


def arguments(whl: Path) -> dict[str, Argument]:
    """Every command-line argument the `Spec` namespace of the wheel gives SGLang's parser, by
    flag (`--speculative-draft-model-path`, its alias `--speculative-draft-model`, ...)."""
    found = {}
    for node in _class(_source(whl, SPEC), "Spec").body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        hint = node.annotation
        if not (isinstance(hint, ast.Subscript) and isinstance(hint.value, ast.Name) and hint.value.id == "A"):
            continue  # not Annotated: no argument
        kind, *extras = hint.slice.elts if isinstance(hint.slice, ast.Tuple) else [hint.slice]
        meta = None
        for extra in extras:  # the first Arg(...) or help string, as _unwrap_annotated reads them
            if isinstance(extra, ast.Constant) and isinstance(extra.value, str):
                meta = {}
            elif isinstance(extra, ast.Call) and isinstance(extra.func, ast.Name) and extra.func.id == "Arg":
                meta = {}
                for keyword in extra.keywords:
                    if isinstance(keyword.value, ast.Attribute):  # argparse.BooleanOptionalAction
                        meta[keyword.arg] = keyword.value.attr
                    else:
                        try:
                            meta[keyword.arg] = ast.literal_eval(keyword.value)
                        except ValueError:  # a name (LOAD_FORMAT_CHOICES, extended elsewhere): not judged
                            meta[keyword.arg] = None
                if isinstance(meta.get("choices"), list):
                    meta["choices"] = tuple(meta["choices"])
            if meta is not None:
                break
        if meta is None or meta.get("no_cli"):
            continue
        field = node.target.id
        flag = meta.get("cli_name") or "--" + field.replace("_", "-")
        argument = _argument(field, kind, meta)
        for name in [flag, *(meta.get("aliases") or [])]:
            found[name] = argument
        if meta.get("action") == "BooleanOptionalAction":
            found["--no-" + flag[2:]] = argument
    return found


def algorithms(whl: Path) -> set[str]:
    """The names `--speculative-algorithm` takes without a plugin: SpeculativeAlgorithm's members
    (NONE is no algorithm) and the reserved aliases that map onto one."""
    members = {target.id for node in _class(_source(whl, ALGORITHMS), "SpeculativeAlgorithm").body
               if isinstance(node, ast.Assign) for target in node.targets if isinstance(target, ast.Name)}
    aliases = set()
    for node in _source(whl, REGISTRY).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_RESERVED_ALIASES" for t in node.targets):
            aliases = {ast.literal_eval(e) for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
    return (members - {"NONE"}) | aliases
