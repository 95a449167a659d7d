"""`proposer=draft`: an independent, smaller model drafting for the target.

A draft that shares the target's tokenizer drafts in its ids (`ModelDrafter`); one with another
tokenizer drafts through its text (`CrossDrafter`: re-tokenised for greedy decoding, the shared
vocabulary for sampling), and `specpipe check` reports the overlap and which way applies.
"""

from __future__ import annotations

from specpipe.checks.result import Check
from specpipe.checks.tokenizers import same_tokenizer_problems
from specpipe.export.engine import sglang_chain
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.models.quantize import check_mode, resolve_precision
from specpipe.proposers.cross_tokenizer import CrossDrafter, SharedVocab
from specpipe.proposers.declaration import Declaration
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, model: str, quantize: str = "int8") -> ModelDrafter | CrossDrafter:
    """Load the draft model named `model` (zoo name, GGUF, directory or hub id)."""
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    source = resolve(model)
    tokenizer = load_tokenizer(source)
    weights = load_model(source)
    if same_tokenizer_problems(context.tokenizer, tokenizer):
        return CrossDrafter.on(context, weights, tokenizer, quantize)
    return ModelDrafter.on(context, weights, quantize)


def vocabulary(target_tokenizer, draft_tokenizer, target: str, draft: str, temperature: float) -> Check:
    """What `specpipe check` says of a draft with another tokenizer."""
    if target_tokenizer is None or draft_tokenizer is None:
        return Check("tokenizer", "ok", f"the draft '{draft}' has another tokenizer than '{target}' (its vocabulary "
                     "overlap is measured once both are fetched): drafted through its text", translated=True)
    shared = SharedVocab(target_tokenizer, draft_tokenizer)
    if shared.size == 0:
        return Check("tokenizer", "refuse", f"the draft '{draft}' shares no token text with '{target}'",
                     "pick a draft whose tokenizer has tokens in common with the target's")
    how = ("greedy: the draft's text is re-tokenised into target tokens (universal assisted generation)"
           if temperature == 0 else "sampling: the draft samples among the shared tokens only (token-level "
           "intersection; rejection sampling keeps the target's distribution)")
    return Check("tokenizer", "ok", f"the draft '{draft}' has another tokenizer than '{target}': {shared.describe()}; "
                 f"{how}", translated=True)


def _vllm(plan) -> dict:
    config = {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma}
    if plan.translated:  # vLLM's token-level intersection (TLI), greedy draft sampling only
        plan.warnings.append("the draft has another tokenizer: exported with use_heterogeneous_vocab (vLLM drafts "
                             "greedily among the shared tokens only); specpipe's re-tokenised greedy drafts, which "
                             "also reach target tokens the draft's vocabulary lacks, are lost.")
        config["use_heterogeneous_vocab"] = True
    return config


def _sglang(plan) -> dict | None:
    if plan.translated:
        plan.warnings.append(f"the draft has another tokenizer, and SGLang {plan.version}'s STANDALONE refuses a draft "
                             "whose vocabulary differs: the command serves the plain target. vLLM serves it "
                             "(use_heterogeneous_vocab).")
        return None
    return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **sglang_chain(plan.gamma)}


DECLARATION = Declaration("draft", tokenizer="any", draft_model="model", early_stop=True, peer="hf-assisted",
                          vocabulary=vocabulary, export={"vllm": _vllm, "sglang": _sglang})
