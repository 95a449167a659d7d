"""Greedy verification: keep draft tokens while they equal the target's argmax.

Output is token-identical to plain greedy decoding of the target (given a batch-invariant
target precision, see DESIGN.md "Lossless in practice").
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.types import DraftBlock, Verdict
from specpipe.verifiers.base import Verifier, first_false, verdict


class GreedyVerifier(Verifier):
    def verify(self, draft: DraftBlock, target_logits: torch.Tensor, rng: torch.Generator) -> Verdict:
        top = target_logits.argmax(-1)  # [γ+1]
        n = first_false(top[: draft.gamma] == draft.tokens)
        return verdict(draft, n, top[n])  # top[n]: recovered (n < γ) or bonus (n == γ)


def build(*, context) -> GreedyVerifier:
    if not context.sampling.greedy:
        raise SpecpipeError(
            f"verifier=greedy cannot honour temperature={context.sampling.temperature}: it keeps "
            "only argmax tokens. Use verifier=rejection to sample losslessly, or temperature=0."
        )
    return GreedyVerifier()
