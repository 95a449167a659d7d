"""`proposer=twin`: the target's own weights at a cheaper precision, drafting for the target.

Lossless whatever the twin's precision, because the target verifies every token; it pays when
the twin's step is much cheaper than the target's and its guesses agree with the target.
"""

from __future__ import annotations

import copy

from specpipe.engine import pick_engine
from specpipe.models.quantize import check_mode
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, quantize: str = "int8") -> ModelDrafter:
    """Built before the pipeline sets the target's precision (so LoRA merges carry over). The
    native engine copies the weights it needs; the hf engine quantizes in place, so it gets a copy."""
    check_mode(quantize, "proposer.quantize")
    model = context.target.model
    if pick_engine(model, context.engine, quantize) == "hf":
        model = copy.deepcopy(model)
    return ModelDrafter.on(context, model, quantize)
