"""The verifier interface: `verify(draft, target_logits, rng) -> Verdict`."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from collections.abc import Callable

from specpipe.types import DraftBlock, DraftTree, Verdict


class Verifier(ABC):
    lossless: bool = True  # False only for verifiers that change the output distribution
    verifies_trees: bool = True  # False: DraftTree drafts are refused (the proposer is told: chains_only)

    @abstractmethod
    def verify(self, draft: DraftBlock, target_logits: torch.Tensor, rng: torch.Generator) -> Verdict:
        """target_logits: [γ+1, V]; row i is the target's prediction for draft token i,
        row γ the bonus position."""


def first_false(mask: torch.Tensor) -> int:
    """Length of the leading run of True in a 1-D bool tensor."""
    return int(mask.long().cumprod(0).sum())


def verdict(draft: DraftBlock, n_accepted: int, next_token: int) -> Verdict:
    return Verdict(
        n_accepted=n_accepted,
        next_token=int(next_token),
        gamma=draft.gamma,
        accepted_tokens=tuple(draft.tokens[:n_accepted].tolist()),
        confidence=() if draft.confidence is None else tuple(draft.confidence.tolist()),
    )


def walk_tree(tree: DraftTree, choose: Callable[[int, list[int]], int | None]) -> tuple[list[int], int]:
    """Descend from the last committed token: at each block row, `choose(row, child nodes)`
    keeps one child or stops. Returns (accepted block rows, the row the walk ended on)."""
    rows: list[int] = []
    node = -1
    while True:
        row = node + 1  # block row of `node` (row 0: the last committed token)
        picked = choose(row, tree.children(node))
        if picked is None:
            return rows, row
        rows.append(picked + 1)
        node = picked


def tree_verdict(tree: DraftTree, rows: list[int], next_token: int) -> Verdict:
    return Verdict(n_accepted=len(rows), next_token=int(next_token), gamma=tree.gamma,
                   accepted_tokens=tuple(int(tree.tokens[r - 1]) for r in rows), path=tuple(rows))
