"""Speculative rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

Each draft token x_i drawn from draft_probs_i is accepted with probability
min(1, target_probs_i[x_i] / draft_probs_i[x_i]). At the first rejection the recovered token
is drawn from norm(max(0, target_probs_i - draft_probs_i)); if all γ are accepted the bonus
token is drawn from target_probs_γ. The emitted tokens are distributed exactly as plain
sampling from the target. A draft without probabilities (model-free or greedy drafter) is
treated as one-hot on its tokens: accepted with probability target_probs_i[x_i], which stays
lossless. Probabilities and ratios are float32; uniforms come from the caller's generator.
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.sampling import SamplingParams, sample
from specpipe.types import DraftBlock, DraftTree, Verdict
from specpipe.verifiers.base import Verifier, first_false, verdict


class RejectionVerifier(Verifier):
    verifies_trees = False
    def __init__(self, sampling: SamplingParams):
        self.sampling = sampling

    def verify(self, draft: DraftBlock, target_logits: torch.Tensor, rng: torch.Generator) -> Verdict:
        if isinstance(draft, DraftTree):
            raise SpecpipeError("verifier=rejection verifies chains only: set proposer.tree=null, or use "
                                "verifier=greedy (temperature=0) or verifier=typical with a tree.")
        target_probs = self.sampling.probs(target_logits)  # [γ+1, V] float32
        gamma = draft.gamma
        if gamma == 0:
            return verdict(draft, 0, sample(target_probs[0], rng))
        rows = torch.arange(gamma)
        target_p = target_probs[rows, draft.tokens]  # [γ] target prob of each draft token
        draft_p = _draft_token_probs(draft)  # [γ]
        uniform = torch.rand(gamma, generator=rng)  # [γ]
        # accept iff u < target_p / draft_p, written without a division (target >= draft: always)
        n = first_false(uniform * draft_p < target_p)
        if n == gamma:
            return verdict(draft, n, sample(target_probs[gamma], rng))  # bonus
        residual = (target_probs[n] - _draft_dist(draft, n, target_probs.shape[-1])).clamp_min(0.0)
        return verdict(draft, n, sample(residual / residual.sum(), rng))  # recovered


def _draft_token_probs(draft: DraftBlock) -> torch.Tensor:
    if draft.probs is None:
        return torch.ones(draft.gamma)  # one-hot draft
    return draft.probs[torch.arange(draft.gamma), draft.tokens].float()


def _draft_dist(draft: DraftBlock, i: int, vocab: int) -> torch.Tensor:
    if draft.probs is None:
        return torch.nn.functional.one_hot(draft.tokens[i], vocab).float()
    return draft.probs[i].float()


def build(*, context) -> RejectionVerifier:
    return RejectionVerifier(context.sampling)
