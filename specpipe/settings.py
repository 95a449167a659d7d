"""The configuration resolved once: `resolve(cfg)` turns a composed config into `Settings`, a
frozen value holding every choice a run makes (the target, its engine and precision with `auto`
decided, the device, kernels, graphs, the proposer's declaration, the draft's model, precision
and engine, sampling, the batch schedule, overlap).

`build` and `checks.run_checks` both read this one value, so the run and `specpipe check` see
the same engine and the same precision: neither decides them again from the config. Only the
models' configs are read here (for the engine a model runs on), never weights.

It is not the rules: a value nobody can run (engine=vllm, a precision that does not exist) is
kept as given, for the rule that concerns it to refuse in its own words (`engine.choice_refusal`,
the checks). Nor is it the components' options: a proposer, verifier or controller is built
from its own config node (`components.call_target`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specpipe.declaration import Declaration, declaration_of
from specpipe.engine import DEVICES, ENGINES, native_chosen, static_step
from specpipe.engine.base import overlaps
from specpipe.errors import SpecpipeError
from specpipe.models.loader import ModelSource, four_bit_source, load_config, resolve as resolve_source, zoo_config
from specpipe.models.quantize import AUTO, resolve_precision
from specpipe.sampling import SamplingParams

UNKNOWN = "its config is unknown"  # why the native engine is not chosen for a model judged without its config
MULTI_LORA = "adapters switched per request need the peft model"


@dataclass(frozen=True)
class Draft:
    """The second model a proposer runs: an independent draft, or the target's own weights (twin)."""

    model: str | None = None  # its name (the target's for a twin); None: the proposer loads no model
    of_target: bool = False  # the target's own weights at another precision (twin)
    precision: str | None = None  # proposer.quantize with `auto` decided for a draft (None: no such option)
    engine: str | None = None  # native | hf | llamacpp; None: no model, or its config is unknown (not fetched)
    reason: str | None = None  # why the native engine cannot run it (None: it can, or no model)
    config: Any = field(default=None, compare=False, repr=False)  # its config, what `engine` was decided from


@dataclass(frozen=True)
class Settings:
    """What a run is, decided once (`resolve`). `engine` is what runs the target; `engine_choice`
    what was asked (the engine's rules judge the choice with `engine_reason`)."""

    model: str  # the target: zoo name, GGUF, directory or hub id
    source: ModelSource = field(compare=False, repr=False)
    engine_choice: str  # engine= as asked: auto | native | hf | llamacpp
    engine: str  # native | hf | llamacpp (a value that is no engine: as given, refused by its rule)
    engine_reason: str | None  # why the native engine cannot run the target (None: it can)
    device: str
    precision: str  # model.quantize with `auto` decided (models/quantize.py `resolve_precision`)
    kernels: str
    graphs: str
    static: bool  # the native engine's static step runs (graphs resolved for the device)
    compile: bool
    cache_len: int
    temperature: float
    top_k: int
    top_p: float
    declaration: Declaration  # what the proposer declares of itself (declaration.py)
    tree_option: bool  # proposer.tree asks for a tree that a chain-only verifier refuses
    tree_auto: bool  # the proposer drafts a tree where it can (else its best path), and it is not turned off
    draft: Draft
    batch_schedule: Any  # as given: `controllers.base.check_schedule` is its rule
    overlap: str  # as given: on | off | auto
    overlapped: bool  # plain steps queued ahead of the host (auto: on CUDA)
    lora: tuple[str, ...]
    early_exit: Any  # a layer count, or None (its range is a rule of the checks)
    rows: int  # sequences decoding at once: bench's concurrency, generate's batch
    chat: bool | None
    fetch: bool  # models were fetched to resolve them (False: check, export judge one not fetched by its zoo entry)
    target_config: Any = field(default=None, compare=False, repr=False)  # None: unknown (not fetched, no zoo entry)

    @property
    def sampling(self) -> SamplingParams:
        """The sampling settings (a SpecpipeError for values the settings check refuses)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def proposer(self) -> str:
        return self.declaration.name

    @property
    def native(self) -> bool:
        return self.engine == "native"

    @property
    def slots(self) -> int:
        """The KV cache slots one sequence gets: cache_len, at most the target's positions."""
        from specpipe.limits import cache_slots

        return cache_slots(self, self.target_config)  # it reads `cache_len`, which these settings hold


def resolve(cfg: DictConfig, *, fetch: bool = True, target_config=None) -> Settings:
    """The settings a composed config describes. fetch=False (check, export): a zoo model not
    fetched yet is judged by its zoo entry instead of being downloaded. target_config: the
    target's config where the caller holds it already (a loaded model's), else read here."""
    name, device, choice = str(cfg.model.name), str(cfg.device), str(cfg.engine)
    source = resolve_source(name, fetch=fetch)
    lora = lora_paths(cfg)
    if target_config is None:
        target_config = known_config(source, name, fetch)
    reason = target_reason(choice, target_config, lora)
    engine, graphs, overlap = engine_of(choice, reason), str(cfg.get("graphs", "auto")), str(cfg.get("overlap", "auto"))
    declaration = declaration_of(cfg.proposer)
    return Settings(
        model=name, source=source, engine_choice=choice, engine=engine, engine_reason=reason, device=device,
        precision=target_precision(cfg.model.get("quantize", "none"), device, choice, name),
        kernels=str(cfg.get("kernels", "exact")), graphs=graphs,
        static=engine == "native" and static_step(graphs, device), compile=bool(cfg.get("compile")),
        cache_len=cfg.cache_len, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
        declaration=declaration, tree_option=declaration.drafts_tree(cfg.proposer),
        tree_auto=declaration.tree == "auto" and bool(cfg.proposer.get("tree", True)),
        draft=_draft(cfg, declaration, engine, reason, target_config, fetch),
        batch_schedule=_plain(cfg.get("batch_schedule")), overlap=overlap,
        overlapped=device in DEVICES and overlaps(overlap, device),  # torch cannot name a device none runs on
        lora=tuple(lora), early_exit=cfg.model.get("early_exit"), rows=batch_size(cfg), chat=cfg.model.get("chat"),
        fetch=fetch, target_config=target_config)


def engine_of(choice: str, reason: str | None) -> str:
    """The engine `engine=` means for a model the native engine cannot run for `reason` (None: it
    can): `engine.native_chosen`, the rule `make_runner` applies to the loaded weights."""
    if choice not in ENGINES or choice == "llamacpp":
        return choice
    return "native" if native_chosen(choice, reason) else "hf"


def target_reason(choice: str, config, lora: list[str]) -> str | None:
    """Why the native engine cannot run the target (None: it can, or llama.cpp runs it)."""
    if choice == "llamacpp":
        return None
    if len(lora) > 1:
        return MULTI_LORA
    return model_reason(config)


def model_reason(config) -> str | None:
    from specpipe.engine.native_model import config_unsupported_reason

    return UNKNOWN if config is None else config_unsupported_reason(config)


def target_precision(mode, device: str, engine: str, name: str):
    """model.quantize with `auto` decided: the device's own, the GGUF's types on llama.cpp, w4a8 for a
    4-bit source on the CPU (`resolve_precision`). compose writes it into the config too, so what a
    results file records is what ran."""
    if not isinstance(mode, str):
        return mode
    four_bit = mode == AUTO and four_bit_source(name)
    return resolve_precision(mode, device, engine=engine, four_bit=four_bit)


def draft_precision(mode, device: str):
    """proposer.quantize with `auto` decided for a draft or head (any precision: the target verifies it)."""
    return resolve_precision(mode, device, draft=True) if isinstance(mode, str) else mode


def _draft(cfg: DictConfig, declaration: Declaration, engine: str, reason: str | None, target_config,
           fetch: bool) -> Draft:
    precision = draft_precision(cfg.proposer.get("quantize"), str(cfg.device))
    if declaration.draft_model is None:
        return Draft(precision=precision)
    if declaration.draft_model == "target":  # the target's weights: its engine
        return Draft(str(cfg.model.name), True, precision, engine, reason, target_config)
    name = draft_model_name(cfg)
    try:
        config = known_config(resolve_source(name, fetch=fetch), name, fetch)
    except SpecpipeError:  # an unreachable draft: the tokenizer check says so, by name
        config = None
    if engine == "llamacpp" or engine not in ENGINES:
        return Draft(name, False, precision, engine, None, config)
    if config is None:
        return Draft(name, False, precision, None, None, None)
    own = model_reason(config)
    return Draft(name, False, precision, engine_of(str(cfg.engine), own), own, config)


def draft_model_name(cfg: DictConfig) -> str | None:
    """The second model a proposer loads (the option its declaration names), or None."""
    option = declaration_of(cfg.proposer).draft_model
    return str(cfg.proposer[option]) if option not in (None, "target") else None


def lora_paths(cfg: DictConfig) -> list[str]:
    lora = cfg.model.get("lora")
    if lora is None:
        return []
    return [str(lora)] if isinstance(lora, str) else [str(p) for p in lora]


def batch_size(cfg: DictConfig) -> int:
    """Sequences decoding at once: bench's concurrency, generate's batch (0: its prompts, at least 1)."""
    return max(int(cfg.get("concurrency") or 1), int(cfg.get("batch") or 1))


def known_config(source: ModelSource, name: str, fetch: bool):
    """A model's config: read from its files where they are here (or fetch=True); a zoo model not
    fetched yet, from its zoo entry; else None (unknown)."""
    if fetch or source.is_dense_cached or fetched(source):
        return load_config(source)
    from specpipe.models import zoo

    return zoo_config(name) if name in zoo.ZOO else None


def fetched(source: ModelSource) -> bool:
    """Whether a model's files are on disk (a GGUF source: its file; a folder: always)."""
    return source.gguf is None or (Path(source.path) / source.gguf).is_file()


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
