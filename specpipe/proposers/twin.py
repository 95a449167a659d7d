"""`proposer=twin`: the target's own weights at a cheaper precision, drafting for the target.

Lossless whatever the twin's precision, because the target verifies every token; it pays when
the twin's step is much cheaper than the target's and its guesses agree with the target.
"""

from __future__ import annotations

import copy

from specpipe.engine import pick_engine
from specpipe.models.quantize import check_mode
from specpipe.proposers.declaration import Declaration
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, quantize: str = "int8") -> ModelDrafter:
    """Built before the pipeline sets the target's precision (so LoRA merges carry over). The
    native engine copies the weights it needs; the hf engine quantizes in place, so it gets a copy."""
    check_mode(quantize, "proposer.quantize")
    model = context.target.model
    if pick_engine(model, context.engine, quantize) == "hf":
        model = copy.deepcopy(model)
    return ModelDrafter.on(context, model, quantize)


def _vllm(plan) -> dict:
    from specpipe.export.vllm import DRAFT_MODEL_NOTE

    plan.warnings += [DRAFT_MODEL_NOTE, "twin: vLLM has no int8 copy of the target as a draft; exported as the "
                      "target drafting for itself with fp8 weights (quantization=fp8, the nearest GPU setting)."]
    return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma, "quantization": "fp8"}


def _sglang(plan) -> dict:
    from specpipe.export.sglang import VERSION, chain

    plan.warnings.append(f"twin: SGLang {VERSION} has no flag to quantize the draft, so the target drafts for "
                         "itself at full cost and this cannot pay; prefer a smaller draft model or ngram there.")
    return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **chain(plan.gamma)}


DECLARATION = Declaration("twin", draft_model="target", early_stop=True, peer="hf-assisted",
                          export={"vllm": _vllm, "sglang": _sglang})
