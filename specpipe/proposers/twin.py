"""`proposer=twin`: the target's own weights at a cheaper precision, drafting for the target.

Lossless whatever the twin's precision, because the target verifies every token; it pays when
the twin's step is much cheaper than the target's and its guesses agree with the target.
"""

from __future__ import annotations

import copy

from specpipe.declaration import Declaration, sglang_chain
from specpipe.engine import pick_engine
from specpipe.engine.llamacpp import twin_refusal
from specpipe.errors import refuse
from specpipe.models.loader import resolve
from specpipe.models.quantize import GGUF, check_mode, resolve_precision
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, quantize: str = "int8", gguf: str | None = None) -> ModelDrafter:
    """Built before the pipeline sets the target's precision (so LoRA merges carry over). The
    native engine copies the weights it needs; the hf engine quantizes in place, so it gets a copy.
    With engine=llamacpp the twin is a lower-bit GGUF of the target (`gguf`), run as it is."""
    if context.engine == "llamacpp":
        refuse(twin_refusal(gguf))
        return ModelDrafter.on(context, resolve(gguf), GGUF)
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    model = context.target.model
    if pick_engine(model, context.engine, quantize) == "hf":
        model = copy.deepcopy(model)
    return ModelDrafter.on(context, model, quantize)


def _vllm(plan) -> dict:
    plan.warnings.append(f"twin: vLLM has no {plan.options.get('quantize')} copy of the target as a draft; exported "
                         "as the target drafting for itself with fp8 weights (quantization=fp8, the nearest GPU "
                         "setting).")
    return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma, "quantization": "fp8"}


def _sglang(plan) -> dict:
    flags = {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **sglang_chain(plan.gamma)}
    if plan.options.get("quantize") == "int8":  # int8 weights: SGLang's nearest is int8 weights and activations
        plan.warnings.append("twin: proposer.quantize=int8 exported as --speculative-draft-model-quantization "
                             "w8a8_int8 (int8 activations too; a draft may use any precision, the target verifies).")
        return {**flags, "--speculative-draft-model-quantization": "w8a8_int8"}
    plan.warnings.append(f"twin: SGLang {plan.version} has no {plan.options.get('quantize')} draft quantization, so the "
                         "target drafts for itself at full cost and this cannot pay; use proposer.quantize=int8.")
    return flags


DECLARATION = Declaration("twin", draft_model="target", early_stop=True, peer="hf-assisted",
                          export={"vllm": _vllm, "sglang": _sglang})
