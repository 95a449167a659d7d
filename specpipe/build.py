"""Assemble a `Pipeline` from a composed config.

Order matters: cheap validation first (sampling, γ, precisions, tokenizers), weights last, so
bad input is refused before anything heavy loads. Component configs name a build function
(`_target_`) and its keyword arguments; only functions under `specpipe.` are called, because a
recipe found beside a model is data from a stranger.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from specpipe.errors import SpecpipeError
from specpipe.models.loader import LoadedModel, ModelSource, load_model, load_tokenizer, resolve
from specpipe.models.quantize import TARGET_SAFE, check_mode, quantize_model
from specpipe.pipeline import Pipeline
from specpipe.sampling import SamplingParams


@dataclass
class BuildContext:
    """Runtime facts a component may need at build time: the target and the sampling settings."""

    name: str
    source: ModelSource
    tokenizer: object
    sampling: SamplingParams
    _target: LoadedModel | None = field(default=None, repr=False)

    @property
    def target(self) -> LoadedModel:
        """The target with dense weights (loaded on first use, before its precision is set)."""
        if self._target is None:
            self._target = LoadedModel(self.name, load_model(self.source), self.tokenizer, self.source)
        return self._target


def build_pipeline(cfg: DictConfig) -> Pipeline:
    sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    quantize = _target_precision(cfg.model.quantize)
    source = resolve(cfg.model.name)
    context = BuildContext(cfg.model.name, source, load_tokenizer(source), sampling)
    verifier = call_target(cfg.verifier, "verifier", context)
    controller = call_target(cfg.controller, "controller", context)
    proposer = call_target(cfg.proposer, "proposer", context)  # may copy the dense target (twin)
    target = context.target
    quantize_model(target.model, quantize)
    return Pipeline(target, proposer, verifier, controller, sampling, chat=cfg.model.chat)


def _target_precision(mode: str) -> str:
    check_mode(mode, "model.quantize")
    if mode not in TARGET_SAFE:
        raise SpecpipeError(
            f"model.quantize={mode} would change what the target computes depending on how many "
            "tokens a forward verifies (one activation scale per call), so speculative output "
            f"would drift from plain decoding. Use one of {', '.join(TARGET_SAFE)} for the target; "
            "int8 is fine for a draft or twin (proposer.quantize=int8)."
        )
    return mode


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
