"""Speculative rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), batched.

Each draft token x_i drawn from draft_probs_i is accepted with probability
min(1, target_probs_i[x_i] / draft_probs_i[x_i]). At the first rejection the recovered token
is drawn from norm(max(0, target_probs_i - draft_probs_i)); if all γ are accepted the bonus
token is drawn from target_probs_γ. The emitted tokens are distributed exactly as plain
sampling from the target. A draft without probabilities (model-free or greedy drafter) is
treated as one-hot on its tokens: accepted with probability target_probs_i[x_i], which stays
lossless. Probabilities and ratios are float32; every row draws from its own `RowRandom`.

Shapes: B rows, W draft columns, V vocabulary. target_probs [B, W + 1, V]; uniforms [B, W].
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.sampling import ACCEPT, RESAMPLE, RowRandom, SamplingParams, sample
from specpipe.types import DraftBatch, Verdict
from specpipe.verifiers.base import Verifier, chain_verdict, drafted, leading


class RejectionVerifier(Verifier):
    verifies_trees = False

    def __init__(self, sampling: SamplingParams):
        self.sampling = sampling

    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: list[RowRandom]) -> Verdict:
        if draft.tree is not None:
            raise SpecpipeError("verifier=rejection verifies chains only: set proposer.tree=null, or use "
                                "verifier=greedy (temperature=0) or verifier=typical with a tree.")
        target_probs = self.sampling.probs(target_logits)  # [B, W + 1, V] float32
        width, tokens = draft.width, draft.tokens
        target_p = target_probs[:, :width].gather(-1, tokens[..., None])[..., 0]  # [B, W]
        draft_p = _draft_token_probs(draft)  # [B, W]
        uniform = uniforms(draft, rngs)  # [B, W]
        # accept iff u < target_p / draft_p, written without a division (target >= draft: always)
        num_accepted = leading((uniform * draft_p < target_p) & drafted(draft))  # [B]
        at = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
        final = target_probs.gather(1, at)[:, 0]  # [B, V] the target at the first rejection or bonus row
        rejected = (num_accepted < draft.num_draft)[:, None]  # [B, 1]
        residual = (final - torch.where(rejected, _draft_dist(draft, num_accepted, final), 0.0)).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), final)  # rounding left nothing: the target
        picks = torch.stack([sample(residual[b], rng(RESAMPLE, residual.device)) for b, rng in enumerate(rngs)])
        return chain_verdict(draft, num_accepted, picks)  # recovered (a rejection) or bonus


def uniforms(draft: DraftBatch, rngs: list[RowRandom]) -> torch.Tensor:
    """[B, W] U(0, 1): row b draws its own γ (not the block's width) from its own stream."""
    device, width = draft.tokens.device, draft.width
    rows = []
    for gamma, rng in zip(draft.gammas, rngs):
        drawn = torch.rand(gamma, generator=rng(ACCEPT, device), device=device)[:width]
        rows.append(torch.cat([drawn, drawn.new_ones(width - drawn.shape[0])]))  # columns it did not draft: unused
    return torch.stack(rows) if rows else torch.empty(0, width, device=device)


def _draft_token_probs(draft: DraftBatch) -> torch.Tensor:
    if draft.probs is None:
        return torch.ones(draft.tokens.shape, device=draft.tokens.device)  # one-hot draft
    return draft.probs.gather(-1, draft.tokens[..., None])[..., 0].float()


def _draft_dist(draft: DraftBatch, at: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, V]: each row's draft distribution at column `at` (clamped into the block; unused where
    the row accepted everything)."""
    if draft.width == 0:
        return torch.zeros_like(like)
    column = at.clamp_max(draft.width - 1)[:, None]  # [B, 1]
    if draft.probs is None:
        token = draft.tokens.gather(1, column)  # [B, 1]
        return torch.zeros_like(like).scatter_(1, token, 1.0)
    return draft.probs.gather(1, column[..., None].expand(-1, 1, like.shape[-1]))[:, 0].float()


def build(*, context) -> RejectionVerifier:
    return RejectionVerifier(context.sampling)
