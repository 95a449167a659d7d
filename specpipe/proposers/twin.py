"""`proposer=twin`: the target's own weights at a cheaper precision, drafting for the target.

Lossless whatever the twin's precision, because the target verifies every token; it pays when
the twin's step is much cheaper than the target's and its guesses agree with the target.
"""

from __future__ import annotations

import copy

from specpipe.models.quantize import check_mode, quantize_model
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, quantize: str = "int8") -> ModelDrafter:
    """Copy the target before the pipeline sets its precision (so LoRA merges carry over)."""
    check_mode(quantize, "proposer.quantize")
    twin = quantize_model(copy.deepcopy(context.target.model), quantize)
    return ModelDrafter(twin, context.sampling)
