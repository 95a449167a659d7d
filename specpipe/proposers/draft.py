"""`proposer=draft`: an independent, smaller model that shares the target's tokenizer."""

from __future__ import annotations

from specpipe.checks import check_same_tokenizer
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.models.quantize import check_mode, quantize_model
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, model: str, quantize: str = "int8") -> ModelDrafter:
    """Load the draft model named `model` (zoo name, GGUF, directory or hub id)."""
    check_mode(quantize, "proposer.quantize")
    source = resolve(model)
    check_same_tokenizer(context.target.tokenizer, load_tokenizer(source), context.target.name, model)
    draft = quantize_model(load_model(source), quantize)
    return ModelDrafter(draft, context.sampling)
