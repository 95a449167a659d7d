"""Assemble a `Pipeline` from a composed config.

Order matters: cheap validation first (sampling, γ, precisions, tokenizers), weights last, so
bad input is refused before anything heavy loads. Component configs name a build function
(`_target_`) and its keyword arguments; only functions under `specpipe.` are called, because a
recipe found beside a model is data from a stranger.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from specpipe.controllers.base import check_schedule
from specpipe.controllers.guard import guarded
from specpipe.checks import Check, draft_model_name, lora_paths, refuse_if_any, run_checks
from specpipe.errors import SpecpipeError
from specpipe.models.adapters import apply_early_exit, apply_lora
from specpipe.models.quantize import resolve_precision
from specpipe.models.loader import LoadedModel, ModelSource, load_config, load_model, load_tokenizer, resolve
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline
from specpipe.sampling import SamplingParams


@dataclass
class BuildContext:
    """Runtime facts a component may need at build time: the target and the sampling settings."""

    name: str
    source: ModelSource
    tokenizer: object
    sampling: SamplingParams
    lora: list[str] = field(default_factory=list)
    early_exit: int | None = None
    engine: str = "auto"  # for the target and any model a proposer loads (draft, twin)
    device: str = "cpu"
    cache_len: int = 2048
    compile: bool = False  # the target's stack only: a draft's steps are many and small, its graphs another compile
    _target: LoadedModel | None = field(default=None, repr=False)

    def runner(self, model, precision: str, compile: bool = False):
        """A runner for a model of this pipeline (target or draft) on the configured engine."""
        return make_runner(model, engine=self.engine, precision=precision, cache_len=self.cache_len,
                           device=self.device, compile=compile)

    @property
    def target(self) -> LoadedModel:
        """The target with dense weights, adapters applied (loaded on first use, before its
        precision is set: LoRA is merged first, then a twin copies it, then both are quantized)."""
        if self._target is None:
            model = apply_early_exit(apply_lora(load_model(self.source), self.lora), self.early_exit)
            self._target = LoadedModel(self.name, model, self.tokenizer, self.source)
        return self._target


def checked_context(cfg: DictConfig) -> tuple[BuildContext, list[Check]]:
    """Run every compatibility check (tokenizers and configs only), then resolve the target."""
    tokenizer = functools.cache(lambda: load_tokenizer(resolve(cfg.model.name)))  # loaded once, if at all
    checks = config_checks(cfg, target_tokenizer=tokenizer)
    refuse_if_any([c for c in checks if c.name in ("settings", "options")])  # nothing below reads bad values
    sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    source = resolve(cfg.model.name)
    context = BuildContext(cfg.model.name, source, tokenizer(), sampling,
                           lora_paths(cfg), cfg.model.get("early_exit"), cfg.engine, cfg.device, cfg.cache_len,
                           cfg.compile)
    return context, checks


def config_checks(cfg: DictConfig, *, fetch: bool = True, target_tokenizer=None) -> list[Check]:
    """The checks of `specpipe check`, `generate`, `bench` and `export`: one path for all.
    fetch=False (export): a zoo model not fetched yet is judged by its zoo entry (its tokenizer
    family) instead of being downloaded; its config is then unknown."""
    def known(load, name):  # a model not fetched yet (export) is not downloaded: its config or tokenizer is unknown
        source = resolve(name, fetch=fetch)
        return load(source) if fetch or source.is_dense_cached or _is_fetched(source) else None

    draft = draft_model_name(cfg)
    return run_checks(cfg, target_tokenizer or (lambda: known(load_tokenizer, cfg.model.name)),
                      lambda: known(load_tokenizer, draft), lambda: known(load_config, cfg.model.name),
                      lambda: known(load_config, draft))


def _is_fetched(source: ModelSource) -> bool:
    from pathlib import Path

    return source.gguf is None or (Path(source.path) / source.gguf).is_file()


def build_pipeline(cfg: DictConfig) -> Pipeline:
    context, checks = checked_context(cfg)
    refuse_if_any(checks)
    verifier = call_target(cfg.verifier, "verifier", context)
    controller = call_target(cfg.controller, "controller", context)
    if controller is not None:
        controller.schedule = check_schedule(cfg.get("batch_schedule"))
    controller = guarded(controller, bool(cfg.get("guard", True)))  # under every controller, unless pinned
    proposer = call_target(cfg.proposer, "proposer", context)  # may copy the dense target (twin)
    target = context.target
    precision = resolve_precision(cfg.model.quantize, context.device)  # a config not composed by specpipe may hold auto
    runner = context.runner(target.model, precision, compile=context.compile)
    pipeline = Pipeline(target, proposer, verifier, controller, context.sampling, chat=cfg.model.chat, runner=runner)
    pipeline.warnings = [c for c in checks if c.status == "warn"]
    return pipeline


def call_target(node: DictConfig, group: str, context: BuildContext):
    """Call the build function a component config names, with its keys as keyword arguments."""
    kwargs = OmegaConf.to_container(node, resolve=True)
    target = kwargs.pop("_target_", None)
    if target is None:
        return None
    if not isinstance(target, str) or not target.startswith("specpipe."):
        raise SpecpipeError(
            f"{group}._target_={target!r} is refused: only build functions under `specpipe.` are "
            "called. Pick a built-in component (see conf/) instead of naming code to run."
        )
    module, _, name = target.rpartition(".")
    try:
        build = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise SpecpipeError(f"{group}._target_={target} does not exist in this specpipe version.") from None
    try:
        return build(context=context, **kwargs)
    except TypeError as err:
        if "keyword argument" not in str(err):
            raise
        raise SpecpipeError(
            f"{group} does not take one of the settings {sorted(kwargs)}: {err}. Check the key's "
            f"spelling against conf/{group}/."
        ) from None
