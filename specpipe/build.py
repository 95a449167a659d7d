"""Assemble a `Pipeline` from a composed config.

Order matters: cheap validation first (sampling, γ, precisions, tokenizers), weights last, so
bad input is refused before anything heavy loads. Component configs name a build function
(`_target_`) and its keyword arguments, called through `components.call_target`. The build returns
the pipeline's parts; `Pipeline.from_config` assembles them, so the build never imports the
pipeline it builds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from omegaconf import DictConfig

from specpipe.controllers.base import check_schedule
from specpipe.checks.identity import draft_model_name, lora_paths
from specpipe.checks.result import Check, refuse_if_any
from specpipe.checks.run import run_checks
from specpipe.components import call_target
from specpipe.controllers.guard import guarded
from specpipe.models.adapters import apply_early_exit, apply_lora
from specpipe.models.quantize import resolve_precision
from specpipe.models.loader import (LoadedModel, ModelSource, load_config, load_model, load_tokenizer, resolve,
                                     zoo_config)
from specpipe.engine import make_runner
from specpipe.engine.base import overlaps
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
    kernels: str = "exact"  # the target's (a draft runs the fastest: the target verifies it)
    graphs: str = "auto"  # the static steps: the target's, and a draft model's (with the fewest rows)
    batch_schedule: dict[int, int] = field(default_factory=dict)  # the controller's γ per batch size (once checked)
    overlapped: bool = False  # plain steps queued ahead of the host (`overlap`): the controller prices them so
    _target: LoadedModel | None = field(default=None, repr=False)

    def runner(self, model, precision: str, compile: bool = False, kernels: str = "fast", graphs: str = "off"):
        """A runner for a model of this pipeline (target or draft) on the configured engine
        (model: torch weights, or with engine=llamacpp its source)."""
        return make_runner(model, engine=self.engine, precision=precision, cache_len=self.cache_len,
                           device=self.device, compile=compile, kernels=kernels, graphs=graphs)

    def weights(self, source: ModelSource):
        """What a runner of this engine loads a model from: llama.cpp reads the GGUF file itself
        (nothing dequantized), the other engines take dense torch weights."""
        return source if self.engine == "llamacpp" else load_model(source)

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
                           cfg.compile, cfg.get("kernels", "exact"), cfg.get("graphs", "auto"),
                           overlapped=overlaps(cfg.get("overlap", "auto"), cfg.device))
    return context, checks


def config_checks(cfg: DictConfig, *, fetch: bool = True, target_tokenizer=None) -> list[Check]:
    """The checks of `specpipe check`, `generate`, `bench` and `export`: one path for all.
    fetch=False (check, export): a zoo model not fetched yet is judged by its zoo entry (its
    config and tokenizer family) instead of being downloaded; its tokenizer is then unknown."""
    def known(load, name, offline=lambda name: None):  # a model not fetched yet is not downloaded
        source = resolve(name, fetch=fetch)
        return load(source) if fetch or source.is_dense_cached or fetched(source) else offline(name)

    draft = draft_model_name(cfg)
    return run_checks(cfg, target_tokenizer or (lambda: known(load_tokenizer, cfg.model.name)),
                      lambda: known(load_tokenizer, draft), lambda: known(load_config, cfg.model.name, zoo_config),
                      lambda: known(load_config, draft, zoo_config))


def fetched(source: ModelSource) -> bool:
    """Whether a model's files are on disk (a GGUF source: its file; a folder: always)."""
    from pathlib import Path

    return source.gguf is None or (Path(source.path) / source.gguf).is_file()


def build_parts(cfg: DictConfig) -> dict:
    """The keyword arguments of `Pipeline` for a composed config (`Pipeline.from_config` calls
    this: the build sits below the pipeline and never constructs one)."""
    context, checks = checked_context(cfg)
    refuse_if_any(checks)
    context.batch_schedule = check_schedule(cfg.get("batch_schedule"))  # the checks refused a bad one
    verifier = call_target(cfg.verifier, "verifier", context)
    controller = call_target(cfg.controller, "controller", context)  # with the context's schedule and overlap
    controller = guarded(controller, bool(cfg.get("guard", True)))  # under every controller unless guard=false
    proposer = call_target(cfg.proposer, "proposer", context)  # may copy the dense target (twin)
    # a config not composed by specpipe may hold auto
    precision = resolve_precision(cfg.model.quantize, context.device, engine=context.engine)
    if context.engine == "llamacpp":  # the GGUF runs as it is; the dense weights load only if something asks
        target = LoadedModel(context.name, None, context.tokenizer, context.source)
        runner = context.runner(context.source, precision, kernels=context.kernels)
    else:
        target = context.target
        runner = context.runner(target.model, precision, compile=context.compile, kernels=context.kernels,
                                graphs=context.graphs)
    return dict(target=target, proposer=proposer, verifier=verifier, controller=controller,
                sampling=context.sampling, chat=cfg.model.chat, runner=runner, overlap=cfg.get("overlap", "auto"),
                warnings=[c for c in checks if c.status == "warn"])
