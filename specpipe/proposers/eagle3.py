"""`proposer=eagle3`: an EAGLE-3 head drafts on three of the target's layers, a chain or a
dynamic tree.

The drafting is `proposer=eagle`'s (specpipe/proposers/eagle.py), given the head's layer list
and its own LM head: the head (specpipe/heads/eagle3.py) fuses the hidden states entering its
`target_layers`, which reach it through the engine's target output as the runner's keys
k - 1, and scores its draft vocabulary with its own `lm_head`, mapped to target ids by `d2t`.
Heads are speculators checkpoints (specpipe/heads/speculators.py): trained by `specpipe train
proposer=eagle3`, or a third party's (a hub head's directory).
"""

from __future__ import annotations

from specpipe.declaration import Declaration, sglang_chain
from specpipe.heads.eagle3 import Eagle3Head, engine_keys
from specpipe.heads.speculators import fit_summary, load_eagle3
from specpipe.models.quantize import check_mode, resolve_precision, quantize_model
from specpipe.proposers.draft_lm import DraftLM
from specpipe.proposers.eagle import EagleProposer, TreeShape
from specpipe.proposers.lookup import lookup_warning, make_lookup
from specpipe.proposers.eagle import validate_options as _validate_tree


def own_lm(head: Eagle3Head):
    """target -> the head's LM head over its draft vocabulary, as target ids."""
    return lambda target: DraftLM(head.logits, head.draft_ids, target.vocab_size)


def proposer_for(head: Eagle3Head, sampling, tree: TreeShape | None = None, quantize: str = "none",
                 lookup=None) -> EagleProposer:
    """proposer=eagle's drafting over this head's layers and LM head (also the trainer's accuracy)."""
    return EagleProposer(head, sampling, tree, quantize, layers=engine_keys(head.target_layers), draft_lm=own_lm(head),
                         lookup=lookup)


def validate_options(options: dict) -> None:
    _validate_tree(options)


def build(*, context, heads: str, tree: dict | None = None, quantize: str = "auto", lookup: bool | str = False,
          lookup_min: int = 3, lookup_max: int = 4, lookup_score: float | None = 1.0) -> EagleProposer:
    """heads: a speculators EAGLE-3 checkpoint folder (checked against the target before any
    weights load); tree: {top_k, nodes} for EAGLE-2's dynamic tree, or None for a chain;
    quantize: the head's precision (drafts may use any: the target verifies them); lookup:
    ngram (or true; matches of lookup_min..lookup_max tokens) or suffix (drafts scoring
    lookup_score) tried before the head each step (false: the head only; see `make_lookup`)."""
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    quantize = quantize if context.device == "cpu" else "none"  # packed kernels are the CPU's; a head is small
    shape = None if tree is None else TreeShape(**dict(tree))
    layers = context.target.model.config.num_hidden_layers  # for a head that names no aux layers
    head = quantize_model(load_eagle3(heads, layers).float(), quantize)  # float32 first: see proposer=eagle's build
    lookup = make_lookup(lookup, lookup_min, lookup_max, lookup_score)
    return proposer_for(head, context.sampling, shape, quantize, lookup)


def _vllm(plan) -> dict:
    """vLLM reads speculators checkpoints itself (`method: eagle3`, the aux layers from their config)."""
    fit_summary(plan.heads)  # a clear error now, not at vLLM's start-up
    lookup_warning(plan, f"vLLM {plan.version}")
    if plan.tree:
        plan.warnings.append(f"proposer.tree: vLLM {plan.version} drafts EAGLE-3 as a chain (it has no token tree); "
                             f"EAGLE-2's dynamic tree is exported as a chain of γ={plan.gamma}.")
    return {"method": "eagle3", "model": plan.heads, "num_speculative_tokens": plan.gamma}


def _sglang(plan) -> dict:
    """SGLang's EAGLE3 drafts EAGLE-2's dynamic tree itself, as its EAGLE does."""
    fit_summary(plan.heads)
    lookup_warning(plan, f"SGLang {plan.version}")
    shape = sglang_chain(plan.gamma) if not plan.tree else {
        "--speculative-num-steps": plan.gamma, "--speculative-eagle-topk": int(plan.tree["top_k"]),
        "--speculative-num-draft-tokens": int(plan.tree["nodes"]) + 1}
    return {"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": plan.heads, **shape}


DECLARATION = Declaration("eagle3", heads=True, hidden="layers", tree="option", early_stop=True, lookup=True,
                          trainer="specpipe.train.eagle3", read_heads=fit_summary,
                          export={"vllm": _vllm, "sglang": _sglang})
