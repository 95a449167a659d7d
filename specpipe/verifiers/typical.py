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
from specpipe.sampling import RESAMPLE, RowRandom, SamplingParams, sample
from specpipe.types import PAD, Verdict
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

    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: list[RowRandom]) -> Verdict:
        target_probs = self.sampling.probs(target_logits)  # [B, W + 1, V] float32 (a tree: one row per block row)
        if draft.tree is not None:
            return self._tree(draft, target_probs[0], rngs[0])
        width = draft.width
        token_p = target_probs[:, :width].gather(-1, draft.tokens[..., None])[..., 0]  # [B, W]
        num_accepted = leading((token_p > self.thresholds(target_probs[:, :width])) & drafted(draft))
        at = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
        final = target_probs.gather(1, at)[:, 0]  # [B, V]
        picks = torch.stack([sample(final[b], rng(RESAMPLE, final.device)) for b, rng in enumerate(rngs)])
        return chain_verdict(draft, num_accepted, picks)

    def _tree(self, draft: DraftBatch, target_probs: torch.Tensor, rng: RowRandom) -> Verdict:
        """Descend from the last token, at each depth to the plausible child the target finds
        most likely (Medusa), stopping where no child is plausible. target_probs [N + 1, V]."""
        tree = TreeRows(draft.tree, target_probs.device)
        node_p = target_probs[tree.parent_rows, draft.tokens[0]]  # [N] each node's token under its parent's row
        plausible = node_p > self.thresholds(target_probs)[tree.parent_rows]  # [N]
        at = torch.full((), -1, dtype=torch.long, device=target_probs.device)  # the node reached (-1: none)
        count = torch.zeros((), dtype=torch.long, device=target_probs.device)
        path = torch.full((tree.size + 1,), PAD, dtype=torch.long, device=target_probs.device)
        for depth in range(tree.depth):
            children = (tree.parents == at) & plausible
            found = children.any() & (count == depth)  # still descending
            best = torch.where(children, node_p, -1.0).argmax()
            at = torch.where(found, best, at)
            path[depth] = torch.where(found, best + 1, PAD)
            count = count + found.long()
        return tree_verdict(draft, tree, path, count, sample(target_probs[at + 1], rng(RESAMPLE, path.device)))


def build(*, context, epsilon: float = 0.09, delta: float = 0.3) -> TypicalVerifier:
    return TypicalVerifier(context.sampling, epsilon, delta)
