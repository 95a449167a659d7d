"""Typical acceptance (Medusa, Cai et al. 2024): LOSSY, labelled so wherever it is used.

Draft token x_i is accepted when the target gives it a probability above
min(epsilon, delta * exp(-H(target_probs_i))): a plausible token, judged more strictly where
the target is sure (low entropy H) and more loosely where it is not. The token after the
accepted prefix is sampled from the target (argmax when greedy). At temperature 0 the target
distribution is one-hot, so this keeps exactly the argmax tokens (greedy output is preserved);
with sampling the output distribution is NOT the target's: it trades fidelity for longer
accepted runs.
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.sampling import SamplingParams, sample
from specpipe.types import DraftBlock, DraftTree, Verdict
from specpipe.verifiers.base import Verifier, first_false, tree_verdict, verdict, walk_tree


class TypicalVerifier(Verifier):
    lossless = False

    def __init__(self, sampling: SamplingParams, epsilon: float = 0.09, delta: float = 0.3):
        if not (0 < epsilon <= 1 and delta > 0):
            raise SpecpipeError(f"verifier.epsilon={epsilon} must be in (0, 1] and verifier.delta={delta} "
                                "positive (Medusa's defaults: epsilon=0.09 delta=0.3).")
        self.sampling, self.epsilon, self.delta = sampling, epsilon, delta

    def thresholds(self, target_probs: torch.Tensor) -> torch.Tensor:
        """[γ, V] -> [γ]: min(epsilon, delta * exp(-entropy)) per row."""
        entropy = -(target_probs * target_probs.clamp_min(1e-30).log()).sum(-1)
        return torch.minimum(torch.full_like(entropy, self.epsilon), self.delta * torch.exp(-entropy))

    def verify(self, draft: DraftBlock | DraftTree, target_logits: torch.Tensor, rng: torch.Generator) -> Verdict:
        target_probs = self.sampling.probs(target_logits)  # [γ+1, V] float32 (a tree: one row per block row)
        if isinstance(draft, DraftTree):
            limits = self.thresholds(target_probs)  # [rows]
            rows, end = walk_tree(draft, lambda row, kids: _most_likely_plausible(kids, draft, target_probs[row], limits[row]))
            return tree_verdict(draft, rows, sample(target_probs[end], rng))
        gamma = draft.gamma
        rows = torch.arange(gamma)
        plausible = target_probs[rows, draft.tokens] > self.thresholds(target_probs[:gamma])  # [γ]
        n = first_false(plausible)
        return verdict(draft, n, sample(target_probs[n], rng))


def _most_likely_plausible(kids: list[int], tree: DraftTree, target_probs: torch.Tensor, limit: torch.Tensor) -> int | None:
    """Of the children the target finds plausible, the one it finds most likely (Medusa)."""
    plausible = [k for k in kids if target_probs[tree.tokens[k]] > limit]
    return max(plausible, key=lambda k: float(target_probs[tree.tokens[k]]), default=None)


def build(*, context, epsilon: float = 0.09, delta: float = 0.3) -> TypicalVerifier:
    return TypicalVerifier(context.sampling, epsilon, delta)
