"""Greedy verification: keep draft tokens while they equal the target's argmax.

Output is token-identical to plain greedy decoding of the target (given a batch-invariant
target precision, see DESIGN.md "Lossless in practice").
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.types import DraftBlock, DraftTree, Verdict
from specpipe.verifiers.base import Verifier, first_false, tree_verdict, verdict, walk_tree


class GreedyVerifier(Verifier):
    def verify(self, draft: DraftBlock | DraftTree, target_logits: torch.Tensor, rng: torch.Generator) -> Verdict:
        top = target_logits.argmax(-1)  # [γ+1] (a tree: [nodes+1], one per block row)
        if isinstance(draft, DraftTree):  # follow the child that is the target's argmax
            rows, end = walk_tree(draft, lambda row, kids: next((k for k in kids if draft.tokens[k] == top[row]), None))
            return tree_verdict(draft, rows, top[end])
        n = first_false(top[: draft.gamma] == draft.tokens)
        return verdict(draft, n, top[n])  # top[n]: recovered (n < γ) or bonus (n == γ)


def build(*, context) -> GreedyVerifier:
    if not context.sampling.greedy:
        raise SpecpipeError(
            f"verifier=greedy cannot honour temperature={context.sampling.temperature}: it keeps "
            "only argmax tokens. Use verifier=rejection to sample losslessly, or temperature=0."
        )
    return GreedyVerifier()
