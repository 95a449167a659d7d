"""`proposer=medusa`: K heads on the target's last hidden state guess the next K tokens at once.

No second model and no draft forward passes: after each verdict the feature of the token that
produced the next token (the target's LM-head input, captured by a hook during the verify
forward) feeds every head once. The first step of a generation has no feature yet and drafts
nothing. With sampling the heads' distributions go to the verifier as draft_probs, so the
rejection verifier stays lossless; `verifier=typical` is Medusa's own (lossy) acceptance.
"""

from __future__ import annotations

import torch

from specpipe.heads.io import load_medusa
from specpipe.heads.medusa import MedusaHeads
from specpipe.proposers.base import Proposer
from specpipe.sampling import SamplingParams, sample
from specpipe.state import DecodeState
from specpipe.types import DraftBlock, Verdict


class FeatureTap:
    """Keeps the input rows of a model's LM head from its latest forward: [n, H]."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.rows: torch.Tensor | None = None
        self._hooked: torch.nn.Module | None = None

    def attach(self) -> None:
        """(Re)attach to the current LM head: quantizing the target replaces the module."""
        head = self.model.get_output_embeddings()
        if head is not self._hooked:
            head.register_forward_pre_hook(self._keep)
            self._hooked = head

    def _keep(self, module, inputs) -> None:
        self.rows = inputs[0][0].detach()  # [n, H] of the batch's only sequence


class MedusaProposer(Proposer):
    def __init__(self, heads: MedusaHeads, target: torch.nn.Module, sampling: SamplingParams):
        self.heads = heads
        self.target = target
        self.sampling = sampling
        self.tap = FeatureTap(target)
        self.feature: torch.Tensor | None = None  # [H] of the last committed token's predecessor row

    def prefill(self, state: DecodeState) -> None:
        self.tap.attach()
        self.feature = None

    @torch.inference_mode()
    def propose(self, state: DecodeState, gamma: int) -> DraftBlock:
        if self.feature is None:
            return DraftBlock.empty()
        gamma = min(gamma, self.heads.num_heads)
        logits = self.heads(self.feature[None], self.target.get_output_embeddings(), heads=gamma)[:, 0]  # [γ, V]
        if self.sampling.greedy:
            tokens = logits.argmax(-1)
            return DraftBlock(tokens, None, torch.softmax(logits, -1).max(-1).values)
        probs = self.sampling.probs(logits)  # [γ, V] float32, the target's transform
        return DraftBlock(sample(probs, state.rng), probs, probs.max(-1).values)

    def commit(self, verdict: Verdict) -> None:
        # row n of the verify forward predicted the token just emitted: its feature drafts next
        self.feature = self.tap.rows[verdict.n_accepted]


def build(*, context, heads: str, num_heads: int | None = None) -> MedusaProposer:
    """heads: a folder written by `specpipe train proposer=medusa` (checked against the target
    before any weights load); num_heads: use only the first ones."""
    loaded = load_medusa(heads)
    if num_heads is not None:
        loaded.num_heads = max(1, min(num_heads, loaded.num_heads))
    return MedusaProposer(loaded, context.target.model, context.sampling)
