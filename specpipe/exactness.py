"""Is a greedy speculative output the plain target's output? And if not, was it a near-tie?

On real models a k-token forward sums in another order than a one-token forward, so the target
can flip a near-tie (top two logits within ~1e-4). A divergence is a failure unless the plain
target's own top-2 gap at the diverging token is that small (docs/concepts.md "Lossless in practice").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpipe.engine import Runner

NEAR_TIE = 1e-3  # logits; fp32-accumulated kernels differ by ~1e-5..1e-4 between block sizes


@dataclass(frozen=True)
class Divergence:
    index: int  # first generated position where the outputs differ
    speculative: int | None
    plain: int | None
    top2_gap: float  # the plain target's logit gap between its two best tokens there

    @property
    def near_tie(self) -> bool:
        return self.top2_gap < NEAR_TIE


def first_divergence(target: Runner, prompt: list[int], speculative: list[int], plain: list[int]) -> Divergence | None:
    """None if equal; else where they part and how close the target's choice was (measured on
    the target's own runner: its row 0 is refilled with the prompt and the plain output up to
    there, in one block)."""
    if speculative == plain:
        return None
    i = next((j for j, (a, b) in enumerate(zip(speculative, plain)) if a != b), min(len(speculative), len(plain)))
    target.reset(0)
    logits = target.prefill(0, prompt + plain[:i]).logits[0, -1]  # the last position's: [V]
    target.reset(0)
    top2 = torch.topk(logits.float(), 2).values
    return Divergence(
        index=i,
        speculative=speculative[i] if i < len(speculative) else None,
        plain=plain[i] if i < len(plain) else None,
        top2_gap=float(top2[0] - top2[1]),
    )
