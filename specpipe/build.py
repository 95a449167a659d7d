"""Assemble a `Pipeline`'s parts from a composed config and its resolved `Settings`.

Order matters: cheap validation first (sampling, γ, precisions, tokenizers), weights last, so
bad input is refused before anything heavy loads. The choices (engine, precision, device...) are
the `Settings` that `specpipe.settings.resolve` made once, and that the checks read too: nothing
here decides them again from the config. Component configs name a build function (`_target_`)
and its keyword arguments, called through `components.call_target`. The build returns the
pipeline's parts; `Pipeline.from_config` assembles them, so the build never imports the
pipeline it builds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from omegaconf import DictConfig

from specpipe.checks.result import Check, refuse_if_any
from specpipe.checks.run import run_checks
from specpipe.checks.validate import check_options, check_settings
from specpipe.components import call_target
from specpipe.controllers.base import check_schedule
from specpipe.controllers.guard import guarded
from specpipe.engine import make_runner
from specpipe.models.adapters import apply_early_exit, apply_lora
from specpipe.models.loader import LoadedModel, ModelSource, load_model, load_tokenizer
from specpipe.models.loader import resolve as resolve_source
from specpipe.sampling import SamplingParams
from specpipe.settings import Settings, fetched, resolve

__all__ = ["BuildContext", "build_parts", "checked_context", "config_checks", "fetched", "resolved"]


@dataclass
class BuildContext:
    """Runtime facts a component may need at build time: the resolved settings (read through the
    attributes below, which the components' build functions take), the target's tokenizer, and
    the target's weights (loaded on first use)."""

    settings: Settings
    tokenizer: object
    _target: LoadedModel | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.settings.model

    @property
    def source(self) -> ModelSource:
        return self.settings.source

    @property
    def sampling(self) -> SamplingParams:
        return self.settings.sampling

    @property
    def engine(self) -> str:
        """The engine of a model a proposer loads (a draft, a twin): the one the settings resolved
        for it from its config, as the batch check read it (the asked choice where it is unknown)."""
        return self.settings.draft.engine or self.settings.engine_choice

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def cache_len(self) -> int:
        return self.settings.cache_len

    @property
    def graphs(self) -> str:
        """The static steps: the target's, and a draft model's (with the fewest rows)."""
        return self.settings.graphs

    @property
    def batch_schedule(self) -> dict[int, int]:
        """The controller's γ per batch size (the checks refused a bad one before any build)."""
        return check_schedule(self.settings.batch_schedule)

    @property
    def overlapped(self) -> bool:
        """Plain steps queued ahead of the host (`overlap`): the controller prices them so."""
        return self.settings.overlapped

    def weights(self, source: ModelSource):
        """What a runner of this engine loads a model from: llama.cpp reads the GGUF file itself
        (nothing dequantized), the other engines take dense torch weights."""
        return source if self.settings.engine == "llamacpp" else load_model(source)

    @property
    def target(self) -> LoadedModel:
        """The target with dense weights, adapters applied (loaded on first use, before its
        precision is set: LoRA is merged first, then a twin copies it, then both are quantized)."""
        if self._target is None:
            model = load_model(self.source)
            model = apply_early_exit(apply_lora(model, list(self.settings.lora)), self.settings.early_exit)
            self._target = LoadedModel(self.name, model, self.tokenizer, self.source)
        return self._target


def resolved(cfg: DictConfig, *, fetch: bool = True) -> Settings:
    """The settings of a config whose values are refused first where they are out of range
    (checks.validate), so a bad value never waits for a download: what a command that runs
    resolves before it builds (`specpipe check` resolves without fetching, and tables them)."""
    refuse_if_any([check_settings(cfg)])
    refuse_if_any([check_options(cfg)])  # after the settings: it builds the controller, sized by them
    return resolve(cfg, fetch=fetch)


def checked_context(cfg: DictConfig, settings: Settings | None = None) -> tuple[BuildContext, list[Check]]:
    """Run every compatibility check (tokenizers and configs only), then hand the build its facts."""
    settings = settings or resolved(cfg)
    tokenizer = functools.cache(lambda: load_tokenizer(settings.source))  # loaded once, if at all
    checks = config_checks(cfg, settings, target_tokenizer=tokenizer)
    refuse_if_any([c for c in checks if c.name in ("settings", "options")])  # nothing below reads bad values
    return BuildContext(settings, tokenizer()), checks


def config_checks(cfg: DictConfig, settings: Settings | None = None, *, fetch: bool = True,
                  target_tokenizer=None) -> list[Check]:
    """The checks of `specpipe check`, `generate`, `bench` and `export`: one path for all, over
    the settings the run resolves (resolved here, with `fetch`, when not given). Settings resolved
    with fetch=False (check, export): a zoo model not fetched yet is judged by its zoo entry (its
    config and tokenizer family) instead of being downloaded; its tokenizer is then unknown."""
    settings = settings or resolve(cfg, fetch=fetch)

    def known(name):  # a model not fetched yet is not downloaded (unless the settings fetched)
        source = resolve_source(name, fetch=settings.fetch)
        return load_tokenizer(source) if settings.fetch or source.is_dense_cached or fetched(source) else None

    draft = settings.draft.model if not settings.draft.of_target else None
    return run_checks(cfg, settings, target_tokenizer or (lambda: known(settings.model)), lambda: known(draft))


def build_parts(cfg: DictConfig, settings: Settings | None = None) -> dict:
    """The keyword arguments of `Pipeline` for a composed config and its settings (resolved here
    when not given; `Pipeline.from_config` calls this: the build sits below the pipeline and
    never constructs one)."""
    context, checks = checked_context(cfg, settings)
    settings = context.settings
    refuse_if_any(checks)
    verifier = call_target(cfg.verifier, "verifier", context)
    controller = call_target(cfg.controller, "controller", context)  # with the context's schedule and overlap
    controller = guarded(controller, bool(cfg.get("guard", True)))  # under every controller unless guard=false
    proposer = call_target(cfg.proposer, "proposer", context)  # may copy the dense target (twin)
    if settings.engine == "llamacpp":  # the GGUF runs as it is; the dense weights load only if something asks
        target = LoadedModel(settings.model, None, context.tokenizer, settings.source)
        weights, compile, graphs = settings.source, False, "off"
    else:
        target = context.target
        weights, compile, graphs = target.model, settings.compile, settings.graphs
    runner = make_runner(weights, engine=settings.engine, precision=settings.precision, cache_len=settings.cache_len,
                         device=settings.device, compile=compile, kernels=settings.kernels, graphs=graphs)
    return dict(target=target, proposer=proposer, verifier=verifier, controller=controller,
                sampling=settings.sampling, chat=settings.chat, runner=runner, overlap=settings.overlap,
                warnings=[c for c in checks if c.status == "warn"])
