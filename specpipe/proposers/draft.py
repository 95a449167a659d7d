"""`proposer=draft`: an independent, smaller model drafting for the target.

A draft that shares the target's tokenizer drafts in its ids (`ModelDrafter`); one with another
tokenizer drafts among the tokens whose text both vocabularies have (`CrossDrafter`; greedy, with
`translate=text`, the default's choice on the CPU, through its text re-tokenised instead), and
`specpipe check` reports the overlap.
"""

from __future__ import annotations

from specpipe.checks.result import Check
from specpipe.checks.tokenizers import same_tokenizer_problems
from specpipe.declaration import Declaration, engine_model, sglang_chain
from specpipe.errors import SpecpipeError
from specpipe.models import zoo
from specpipe.models.loader import load_tokenizer, resolve
from specpipe.models.quantize import check_mode, resolve_precision
from specpipe.proposers.cross_tokenizer import CrossDrafter, SharedVocab, check_translate
from specpipe.proposers.model_drafter import ModelDrafter


def build(*, context, model: str, quantize: str = "int8", fallback_model: str | None = None,
          translate: str = "auto") -> ModelDrafter | CrossDrafter:
    """Load the draft model named `model` (zoo name, GGUF, directory or hub id). fallback_model is
    read by the exports only: what an engine without cross-tokenizer drafts serves instead.
    translate: how a greedy draft with another tokenizer reaches target ids (`CrossDrafter`)."""
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    check_translate(translate)  # a wrong name is refused whichever tokenizer the draft turns out to have
    source = resolve(model)
    tokenizer = load_tokenizer(source)
    weights = context.weights(source)  # engine=llamacpp: the GGUF itself
    if same_tokenizer_problems(context.tokenizer, tokenizer):
        return CrossDrafter.on(context, weights, tokenizer, quantize, translate)
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
    how = ("greedy: the draft picks among the shared tokens only (token-level intersection), or with "
           "proposer.translate=text (auto's choice on the CPU) its text is re-tokenised into target tokens: "
           "universal assisted generation" if temperature == 0 else "sampling: the draft samples among the shared tokens only "
           "(token-level intersection; rejection sampling keeps the target's distribution)")
    return Check("tokenizer", "ok", f"the draft '{draft}' has another tokenizer than '{target}': {shared.describe()}; "
                 f"{how}", translated=True)


def _vllm(plan) -> dict | None:
    if not plan.translated:
        return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma}
    if "use_heterogeneous_vocab" in plan.keys:  # vLLM's token-level intersection (TLI), 0.32-0.33
        plan.warnings.append("the draft has another tokenizer: exported with use_heterogeneous_vocab (vLLM drafts "
                             "greedily among the shared tokens only); specpipe's re-tokenised greedy drafts, which "
                             "also reach target tokens the draft's vocabulary lacks, are lost.")
        return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma,
                "use_heterogeneous_vocab": True}
    draft = _same_tokenizer_draft(plan, f"vLLM {plan.version} has no draft with another tokenizer (it removed "
                                        "use_heterogeneous_vocab with its V1 model runner)", "engine_version=0.33.0")
    return draft and {"method": "draft_model", "model": draft, "num_speculative_tokens": plan.gamma}


def _sglang(plan) -> dict | None:
    if plan.translated:
        draft = _same_tokenizer_draft(plan, f"SGLang {plan.version}'s STANDALONE refuses a draft whose vocabulary "
                                            "differs", "`specpipe export vllm engine_version=0.33.0`")
        if draft is None:
            return None
    else:
        draft = plan.draft
    return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": draft,
            **sglang_chain(plan.gamma)}


def _same_tokenizer_draft(plan, why: str, older: str) -> str | None:
    """For an engine without cross-tokenizer drafts: the draft with the target's tokenizer the
    recipe names (`proposer.fallback_model`), else None (the plain target), the loss named."""
    fallback = plan.options.get("fallback_model")
    if not fallback:
        plan.warnings.append(f"the draft has another tokenizer, and {why}: the command serves the plain target and "
                             "the draft's speedup is lost. Name a draft with the target's tokenizer as "
                             f"proposer.fallback_model{_suggestion(plan.model)} to serve it instead, or export "
                             f"for an engine that serves this draft ({older}).")
        return None
    _check_fallback(plan.model, str(fallback))
    served = engine_model(str(fallback))
    plan.warnings.append(f"the draft has another tokenizer, and {why}: exported with proposer.fallback_model "
                         f"({served}), which shares the target's tokenizer; proposer.model's drafts are lost.")
    return served


def _suggestion(target: str) -> str:
    drafts = zoo.drafts_for(target)
    return f" (e.g. proposer.fallback_model={drafts[0]})" if drafts else ""


def _check_fallback(target: str, fallback: str) -> None:
    """A fallback that is a zoo model of another tokenizer family than a zoo target is refused
    here, by key; any other is the user's word (its tokenizer is read only when it runs)."""
    if target in zoo.ZOO and fallback in zoo.ZOO and \
            zoo.ZOO[target].tokenizer_family != zoo.ZOO[fallback].tokenizer_family:
        raise SpecpipeError(f"proposer.fallback_model={fallback}: its tokenizer ({zoo.ZOO[fallback].tokenizer_family}) "
                            f"is not the target's ({zoo.ZOO[target].tokenizer_family}), which engines without "
                            f"cross-tokenizer drafts need. Name a draft of {target}'s family"
                            f"{_suggestion(target)}, or none.")


DECLARATION = Declaration("draft", tokenizer="any", draft_model="model", early_stop=True, peer="hf-assisted",
                          vocabulary=vocabulary, export={"vllm": _vllm, "sglang": _sglang})
