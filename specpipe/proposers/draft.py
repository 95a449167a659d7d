"""`proposer=draft`: an independent, smaller model that shares the target's tokenizer."""

from __future__ import annotations

from specpipe.models.loader import load_model, resolve
from specpipe.models.quantize import check_mode
from specpipe.proposers.declaration import Declaration
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, model: str, quantize: str = "int8") -> ModelDrafter:
    """Load the draft model named `model` (zoo name, GGUF, directory or hub id)."""
    check_mode(quantize, "proposer.quantize")
    # the tokenizer check ran before any weights loaded (specpipe/checks.py)
    return ModelDrafter.on(context, load_model(resolve(model)), quantize)


def _vllm(plan) -> dict:
    from specpipe.export.vllm import DRAFT_MODEL_NOTE

    plan.warnings.append(DRAFT_MODEL_NOTE)
    return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma}


def _sglang(plan) -> dict:
    from specpipe.export.sglang import chain

    return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **chain(plan.gamma)}


DECLARATION = Declaration("draft", tokenizer="same", draft_model="model", early_stop=True, peer="hf-assisted",
                          export={"vllm": _vllm, "sglang": _sglang})
