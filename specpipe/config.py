"""Structured configs: the schema Hydra checks every override against.

Component groups (`model`, `proposer`, `verifier`, `controller`) are YAML files under conf/;
each component file names a `_target_` build function under `specpipe.` and its plain keyword
arguments. Top-level keys are typed here, so `gamma=abc` or a misspelt key is an error before
anything loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from specpipe import recipe as recipes
from specpipe.errors import SpecpipeError
from specpipe.paths import conf_dir  # noqa: F401  (re-exported: the CLI and tests read it here)


@dataclass
class DecodeConfig:
    """What every command that decodes shares: the four parts and the sampling settings."""

    model: Any = MISSING  # conf/model/: name (zoo name, .gguf, directory, hub id), quantize, chat
    proposer: Any = MISSING  # conf/proposer/
    verifier: Any = MISSING  # conf/verifier/
    controller: Any = MISSING  # conf/controller/
    strategy: str = ""  # a named composition (strategies/NAME.yaml or a path), applied first
    recipe: str = ""  # a tuned recipe (recipes/<model>/specpipe.yaml or a path), applied first
    gamma: int = 4  # draft tokens per step (the fixed controller's γ; adaptive ones start here)
    gamma_min: int = 1  # bounds every controller respects (the cost controller may go to 0)
    gamma_max: int = 8
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    engine: str = "auto"  # native (own forward: Llama, Qwen2 families) | hf (any transformers model) | auto
    # | llamacpp (the GGUF on llama.cpp's CPU kernels; `specpipe install llamacpp`)
    device: str = "cpu"  # cpu | cuda (native engine)
    cache_len: int = 2048  # native KV cache slots per sequence (at most the model's max_position_embeddings)
    compile: bool = False  # native engine: torch.compile the target's decoder stack (docs/engine.md: what it buys)
    # native engine: on (decode steps in fixed shapes over persistent buffers, captured as CUDA graphs on
    # a GPU; eager on the CPU) | off (per-step shapes, eager) | auto (on where device=cuda)
    graphs: str = "auto"
    # the target's: exact (a verify block's rows bitwise equal plain steps' rows) | fast (within tolerance).
    # engine=native with graphs: exact runs plain steps in the verify blocks' shape, fast the fewest rows;
    # engine=llamacpp: exact keeps a q8_0 KV cache and the file's weight layout, fast is llama.cpp's
    # defaults (f16 KV, repacked weights). Eager native steps and engine=hf have no kernels to choose
    kernels: str = "exact"
    # plain decoding: on (each step queued on the device before the last one's tokens are read, so the
    # host's work between steps hides behind the device's) | off | auto (on where device=cuda)
    overlap: str = "auto"
    batch_schedule: Any = None  # {batch size: γ} at batch > 1, like vLLM's γ per batch size (0: plain there)
    # per request, γ = 0 while speculation measures slower than plain steps (controllers/guard.py);
    # false: γ is what the controller says, every step (a pinned γ: to measure a γ as it is, or to
    # keep a seeded sample identical run to run)
    guard: bool = True


@dataclass
class GenerateConfig(DecodeConfig):
    prompt: str = "Write a Python function that checks whether a string is a palindrome."
    baseline: bool = True  # also run the plain target on the same prompt and measure the speedup
    output: str = "rich"  # rich | json | text
    batch: int = 0  # several prompt=: how many decode at once (0: all of them)


@dataclass
class BenchConfig(DecodeConfig):
    prompts: str = "dev"  # a built-in prompt set, or a JSONL path ({"id", "category", "messages"})
    categories: list[str] = field(default_factory=list)  # empty: every category of the set
    limit: int = 0  # prompts per category (0: all)
    warmup: int = 1  # generations per configuration before anything is measured
    peer: Any = None  # hf-assisted | hf-prompt-lookup | llama-cpp | llama-cpp-lookup | a list | auto: peers as baselines
    plot: bool = False  # also write PNG plots beside results.json
    out: str = "bench-results"  # results.json goes here; a sweep puts one folder per job in it
    requests: int = 0  # > 0: a request load of this many requests drawn from the prompt set (bench/load.py)
    concurrency: int = 1  # a request load's batch: requests decoding at once (continuous batching)


@dataclass
class TuneConfig(BenchConfig):
    # two disjoint prompt sets: the winner is chosen on one (`prompts=` is its short form; categories=
    # picks among its categories) and reported on the other (every category; `none`: no report split),
    # where a winner with a model must beat the best of ngram and suffix to ship; limit= applies to both
    choose_on: str = "${prompts}"
    report_on: str = "held-aside"
    strategies: list[str] = field(default_factory=list)  # names from strategies/ to try (empty: all)
    gammas: list[int] = field(default_factory=lambda: [2, 4, 6])  # fixed γ values tried
    batch_sizes: list[int] = field(default_factory=list)  # e.g. [4, 8]: measure the winner's γ there (batch_schedule)
    draft: str = ""  # the draft model for draft strategies (default: a smaller zoo model, same tokenizer)
    out: str = "recipes"  # recipes/<model>/specpipe.yaml; `beside`: <model dir>/specpipe.yaml
    work: str = "bench-results/tune"  # each candidate's results.json (an interrupted tune resumes)
    overwrite: bool = False  # replace a recipe already at the destination (else refused: it may be the shipped one)


@dataclass
class TrainConfig:
    model: Any = MISSING  # the frozen target
    proposer: Any = MISSING  # which heads: medusa or eagle
    num_heads: int = 4  # medusa: heads to train (head k guesses the token k+1 ahead); eagle: γ of the recipe
    layers: int = 1  # medusa: residual blocks per head
    intermediate_size: int = 0  # eagle: the head's MLP width (0: the target's)
    unroll: int = 1  # eagle: extra passes on the head's own feature guesses (0: teacher forcing only)
    ttt: int = 4  # eagle3: training-time test steps (the head unrolled on its own outputs, a loss on each)
    target_layers: list[int] = field(default_factory=list)  # eagle3: target layers whose input it fuses ([]: 2, L/2, L-3)
    sources: list[str] = field(default_factory=lambda: ["stdlib", "docs"])  # offline text
    tokens: int = 60000  # training text, in target tokens
    distill: int = 0  # self-distillation: the target's own answers to this many offline prompts
    distill_prompts: str = ""  # their JSONL (default: offline instructions, specpipe/train/prompts.py)
    # the offline instructions: templates (train/prompts.py), requests (written ones,
    # train/requests.py, then the templates), self (the target writes them:
    # train/self_instruct.py) or mixed (templates and self in turn)
    instructions: str = "templates"
    distill_tokens: int = 128  # answer length
    distill_batch: int = 16  # answers decoded at once (native engine: continuous batching; hf: static batches of 32)
    seq_len: int = 256
    epochs: int = 3
    batch: int = 256  # training rows per optimizer step
    lr: float = 1e-3  # peak learning rate: a short warmup, then a cosine decay to zero
    vocab_subset: int = 8192  # the most frequent labels get a cross-entropy column
    held_out: float = 0.05  # share of sequences kept for the accuracy figures
    dtype: str = "float32"  # the stored heads' precision (trained in float32; they decode in float32)
    seed: int = 0
    resume: bool = True  # continue an interrupted run from its last checkpoint
    init: str = ""  # start from these trained heads (a folder train wrote) instead of fresh ones: train them further
    engine: str = "auto"  # the target's engine for feature extraction (see DecodeConfig)
    out: str = "recipes"  # heads go to <out>/<model>/<proposer>/, the recipe to <out>/<model>/<proposer>.yaml
    overwrite: bool = False  # replace heads and a recipe already there (else refused: they may be the shipped ones)


def job_dir_name(override_dirname: str) -> str:
    """A sweep job's folder name from its settings: `model=custom,model.name='/a/b/m'` reads
    `model=m`, and nothing in it can make a sub-folder or need quoting in a shell."""
    name = override_dirname.replace("model=custom,", "").replace(",model=custom", "")
    name = re.sub(r"model\.name='?([^',]*)'?", lambda m: "model=" + Path(m.group(1).rstrip("/")).name, name)
    return re.sub(r"[^\w=,.+-]", "_", name) or "defaults"


def register() -> None:
    OmegaConf.register_new_resolver("specpipe_job_dir", job_dir_name, replace=True)
    store = ConfigStore.instance()
    for name, node in {"generate_schema": GenerateConfig, "bench_schema": BenchConfig,
                       "tune_schema": TuneConfig, "train_schema": TrainConfig}.items():
        store.store(name=name, node=node)


RECIPE_COMMANDS = ("generate", "check", "bench")  # and export (as generate): a zoo target's shipped recipe by default


def compose(overrides: list[str] = (), command: str = "generate") -> DictConfig:
    """The composed, resolved config of `command` (what the CLI runs); a bad override is a
    SpecpipeError. Library use: `Pipeline.from_config(compose(["proposer=draft", "gamma=3"]))`.
    As on the command line, naming no proposer, strategy or recipe on a zoo target applies its
    shipped recipe (`with_shipped_recipe`): `compose([])` is what `specpipe generate` runs."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register()
    typed = list(overrides)  # what the error names: the user's settings, not what a recipe expands to
    applied = with_shipped_recipe(typed, command, conf_dir())
    overrides = expand_overrides(applied, conf_dir())
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir()), job_name="specpipe"):
            cfg = hydra_compose(config_name=command, overrides=list(overrides))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        detail = _condense(str(err))
        if err.__cause__ is not None:  # e.g. "Key 'quantize' is not in struct"
            detail += " (" + str(err.__cause__).splitlines()[0] + " for this choice.)"
        if "is not a ListConfig" in detail:  # `gammas=4`: a list setting given one value
            detail += " A list is written in brackets: key=[a,b,c] (e.g. gammas=[2,4,6])."
        raise SpecpipeError(
            f"The settings `{' '.join(typed)}` are not valid: {detail}{_recipe_hint(applied, detail)} Settings are key=value "
            f"pairs from conf/{command}.yaml; components are chosen by name (proposer=draft, "
            "verifier=rejection, ...) from the folders of conf/."
        ) from None
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return _precisions(cfg)


def _precisions(cfg: DictConfig) -> DictConfig:
    """`model.quantize=auto` (and a draft's or head's `proposer.quantize`) written as the precision
    that runs, so what a config records (results.json, export, train) is what ran. The rule is
    `specpipe.settings`' (`target_precision`, `draft_precision`), the one the settings resolve by."""
    from specpipe.settings import draft_precision, target_precision

    device = str(cfg.get("device", "cpu"))
    with open_dict(cfg):
        if "model" in cfg and isinstance(cfg.model.get("quantize"), str):
            cfg.model.quantize = target_precision(cfg.model.quantize, device, str(cfg.get("engine", "auto")),
                                                  str(cfg.model.get("name", "")))
        if "proposer" in cfg and isinstance(cfg.proposer.get("quantize"), str):
            cfg.proposer.quantize = draft_precision(cfg.proposer.quantize, device)
    return cfg


def _recipe_hint(typed: list[str], detail: str) -> str:
    """A recipe's settings come first: an option of another component than the recipe chose is
    refused for that component, which the user may not know they were using. Said only for that
    error (a key the chosen component does not have), never beside a bad value."""
    recipe = next((arg.partition("=")[2] for arg in typed if arg.startswith("recipe=")), None)
    unknown_key = "not in struct" in detail or "Could not override" in detail
    return "" if recipe is None or not unknown_key else (f" (recipe={recipe} is applied first: an option of a component other than "
                                       "the one it chose needs that component named too, e.g. proposer=ngram "
                                       "proposer.ngram_max=3.)")


def _condense(message: str) -> str:
    """Hydra's multi-line message as one sentence, without its search-path dump and `+key` hint."""
    message = message.split("Config search path")[0]
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and not line.startswith("To append"))


def expand_overrides(overrides: list[str], conf: Path) -> list[str]:
    """`strategy=`, `recipe=` and `model=<a folder holding specpipe.yaml>` become the settings
    they hold, placed before the user's own (which win); then `model=PATH_OR_HUB_ID` (not a file
    of conf/model/) becomes `model=custom model.name=...`."""
    given = _given(overrides)
    front: list[str] = []
    if "strategy" in given:
        front += recipes.as_overrides(recipes.load_strategy(given["strategy"]))
    found = _recipe_of(given, conf)
    if found is not None:
        front += recipes.as_overrides(recipes.resolve_artifacts(found))
        if "model" not in given:
            front.insert(0, f"model={found.model}")
        if "recipe" not in given:  # one kept beside the model: recorded too (its measured block is read later)
            front.insert(0, f"recipe={recipes.literal(str(found.path))}")
    user = [_absolute_recipe(arg, found) for arg in overrides]
    front = [arg for arg in front if not _shadowed(arg, given)]
    return _rewrite_models(front + user, conf)


def with_shipped_recipe(overrides: list[str], command: str, conf: Path) -> list[str]:
    """`recipe=` of the shipped recipe of a zoo target (recipes/<model>/specpipe.yaml: the
    strategy `specpipe tune` measured best for it) put first, when the user names no proposer,
    strategy or recipe: plain `specpipe generate` decodes with what pays on that model. Their
    own settings still win (gamma=, controller=, ...). Nothing for other targets: a folder
    holding its own specpipe.yaml already applies it, and a model without one gets conf/'s
    defaults. The one place this rule lives: `compose` applies it for generate, check and bench
    (export composes as generate), and the CLI's `-m` sweeps before Hydra reads their settings."""
    given = _given(overrides)
    if command not in RECIPE_COMMANDS or any(key in ("proposer", "strategy", "recipe") for key in given):
        return overrides
    model = given.get("model") or _default_model(command, conf)
    found = recipes.shipped_recipe(model) if model in _known_models(conf) else None
    if found is None or not _options_of_its_proposer(given, found, conf):
        return overrides
    return [f"recipe={found}", *overrides]  # quoted by expand_overrides


def _options_of_its_proposer(given: dict[str, str], recipe_path: Path, conf: Path) -> bool:
    """Whether the proposer options the user names (`proposer.tree=...`) are options of the recipe's
    proposer: then they tune the recipe; an option only another proposer has (`proposer.ngram_max`)
    means that proposer, conf/'s default, rather than the recipe with an option it would refuse."""
    options = {key.partition(".")[2].partition(".")[0] for key in given if key.startswith("proposer.")}
    if not options:
        return True
    kind = str(recipes.load_recipe(recipe_path).strategy.get("proposer", ""))
    known = conf / "proposer" / f"{kind}.yaml"
    return known.is_file() and options <= set(OmegaConf.load(known))


def _default_model(command: str, conf: Path) -> str:
    defaults = OmegaConf.load(conf / f"{command}.yaml").get("defaults", [])
    return next((entry["model"] for entry in defaults if isinstance(entry, DictConfig) and "model" in entry), "")


def _given(overrides: list[str]) -> dict[str, str]:
    given = {}
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if eq:
            given[key.lstrip("+~")] = value
    for key in ("strategy", "recipe"):
        if "," in given.get(key, ""):
            raise SpecpipeError(f"{key}={given[key]}: one {key} per run (a sweep over {key} values is not "
                                "supported); run one command for each.")
    return given


def _recipe_of(given: dict[str, str], conf: Path) -> recipes.Recipe | None:
    model = given.get("model", "")
    if given.get("recipe"):
        found = recipes.load_recipe(given["recipe"])
        if model and not found.is_for(model):
            raise SpecpipeError(f"recipe={given['recipe']} was tuned for {found.target}, not model={model}. Drop "
                                "model= (the recipe names its target) or use a recipe made for this model.")
        return found
    if model and model not in _known_models(conf) and (Path(model) / recipes.RECIPE_FILE).is_file():
        return recipes.load_recipe(Path(model))  # a recipe kept beside the model
    return None


def _absolute_recipe(arg: str, found) -> str:
    """`recipe=` as the absolute path of the file read (the config records what was applied)."""
    if found is not None and arg.partition("=")[0] == "recipe":
        return f"recipe={recipes.literal(str(found.path))}"
    return arg


def _shadowed(arg: str, given: dict[str, str]) -> bool:
    """A setting the user gives too; or an option of a proposer, verifier or controller whose
    choice the user changes. The model's settings (model.quantize, model.chat) stay when the
    user names the model: a recipe's target is that model (`_recipe_of` refuses another), and a
    strategy's precision is meant for whatever model runs it."""
    key = arg.partition("=")[0]
    group = key.partition(".")[0]
    return key in given or (group != "model" and group in given)


def _known_models(conf: Path) -> set[str]:
    return {p.stem for p in (conf / "model").glob("*.yaml")}


def _rewrite_models(overrides: list[str], conf: Path) -> list[str]:
    known = _known_models(conf)
    out = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if key == "model" and eq and value not in known and "," not in value:
            out += ["model=custom", f"model.name={recipes.literal(value)}"]
        else:
            out.append(arg)
    return out
