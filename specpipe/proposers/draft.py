"""`proposer=draft`: an independent, smaller model that shares the target's tokenizer."""

from __future__ import annotations

from specpipe.models.loader import load_model, resolve
from specpipe.models.quantize import check_mode
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, model: str, quantize: str = "int8") -> ModelDrafter:
    """Load the draft model named `model` (zoo name, GGUF, directory or hub id)."""
    check_mode(quantize, "proposer.quantize")
    # the tokenizer check ran before any weights loaded (specpipe/checks.py)
    return ModelDrafter.on(context, load_model(resolve(model)), quantize)
