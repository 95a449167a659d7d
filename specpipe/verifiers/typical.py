"""Typical acceptance (Medusa, Cai et al. 2024): LOSSY, labelled so wherever it is used.

Draft token x_i is accepted when the target gives it a probability above
min(epsilon, delta * exp(-H(target_probs_i))): a plausible token, judged more strictly where
the target is sure (low entropy H) and more loosely where it is not. The token after the
accepted prefix is sampled from the target (argmax when greedy). At temperature 0 the target
distribution is one-hot, so this keeps exactly the argmax tokens (greedy output is preserved);
with sampling the output distribution is NOT the target's: it trades fidelity for longer
accepted runs. Batched on the device: B rows, W draft columns, V vocabulary.
"""

from __future__ import annotations

import torch

from specpipe.drafts import DraftBatch
from specpipe.errors import SpecpipeError
from specpipe.sampling import RESAMPLE, SamplingParams, StepRandom, race
from specpipe.types import Verdict
from specpipe.verifiers.base import TreeRows, Verifier, chain_verdict, drafted, leading, tree_verdict


class TypicalVerifier(Verifier):
    lossless = False

    def __init__(self, sampling: SamplingParams, epsilon: float = 0.09, delta: float = 0.3):
        if not (0 < epsilon <= 1 and delta > 0):
            raise SpecpipeError(f"verifier.epsilon={epsilon} must be in (0, 1] and verifier.delta={delta} "
                                "positive (Medusa's defaults: epsilon=0.09 delta=0.3).")
        self.sampling, self.epsilon, self.delta = sampling, epsilon, delta

    def thresholds(self, target_probs: torch.Tensor) -> torch.Tensor:
        """[..., V] -> [...]: min(epsilon, delta * exp(-entropy)) per row."""
        entropy = -(target_probs * target_probs.clamp_min(1e-30).log()).sum(-1)
        return torch.minimum(torch.full_like(entropy, self.epsilon), self.delta * torch.exp(-entropy))

    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: StepRandom) -> Verdict:
        target_probs = self.sampling.probs(target_logits)  # [B, W + 1, V] float32 (a tree: one row per block row)
        if draft.tree is not None:
            return self._tree(draft, target_probs, rngs)
        width = draft.width
        token_p = target_probs[:, :width].gather(-1, draft.tokens[..., None])[..., 0]  # [B, W]
        num_accepted = leading((token_p > self.thresholds(target_probs[:, :width])) & drafted(draft))
        at = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
        final = target_probs.gather(1, at)[:, 0]  # [B, V]
        picks = race(final, StepRandom.of(rngs).exponential(RESAMPLE, final.shape[1:], final.device))  # [B]
        return chain_verdict(draft, num_accepted, picks)

    def _tree(self, draft: DraftBatch, target_probs: torch.Tensor, rngs: StepRandom) -> Verdict:
        """Descend from the last token, at each depth to the plausible child the target finds
        most likely (Medusa), stopping where no child is plausible: a node is chosen when it is
        plausible and the likeliest of its plausible siblings (the first on ties), and each row
        keeps the path to its deepest node chosen all the way down. target_probs [B, N + 1, V]."""
        tree = TreeRows(draft.tree)
        batch, n = draft.tokens.shape
        vocab = target_probs.shape[-1]
        flat = target_probs.reshape(batch, -1)  # [B, (N + 1)·V]
        node_p = flat.gather(1, tree.parent_rows * vocab + draft.tokens)  # [B, N] each token under its parent's row
        plausible = (node_p > self.thresholds(target_probs).gather(1, tree.parent_rows)) & tree.real  # [B, N]
        siblings = (tree.parents[:, :, None] == tree.parents[:, None, :]) & plausible[:, None, :]  # [B, N, N]
        best = torch.where(siblings, node_p[:, None, :], -1.0).argmax(2)  # [B, N] each node's likeliest sibling
        chosen = plausible & (best == torch.arange(n, device=best.device))

        def pick(end: torch.Tensor) -> torch.Tensor:
            final = target_probs[torch.arange(batch, device=end.device), end]  # [B, V]
            return race(final, StepRandom.of(rngs).exponential(RESAMPLE, final.shape[1:], final.device))

        return tree_verdict(draft, tree, chosen, pick=pick)


def build(*, context, epsilon: float = 0.09, delta: float = 0.3) -> TypicalVerifier:
    return TypicalVerifier(context.sampling, epsilon, delta)
