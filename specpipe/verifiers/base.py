"""The verifier interface: `verify(draft, target_logits, rngs) -> Verdict`, batched on the device.

A verifier sees every row's draft at once (`DraftBatch`: `[B, W]` tokens, `num_draft [B]`) and
the target's logits of the verify block (`[B, W + 1, V]`, row i predicting draft token i) and
answers in vLLM's layout: emitted ids `[B, W + 1]` padded with -1 and `num_accepted [B]`, all
tensor ops on the logits' device; nothing here reads a value back to the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

import torch.nn.functional as F

from specpipe.drafts import DraftBatch, lineage
from specpipe.engine.base import Tail
from specpipe.sampling import RowRandom, StepRandom
from specpipe.types import PAD, RowVerdict, Verdict, packed_verdict


class Verifier(ABC):
    lossless: bool = True  # False only for verifiers that change the output distribution
    verifies_trees: bool = True  # False: tree drafts are refused (a step tells proposers: rows.trees)

    @abstractmethod
    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: StepRandom) -> Verdict:
        """target_logits: [B, W + 1, V]; row i of b is the target's prediction for draft token
        i of row b, row num_draft[b] its bonus position (a tree: one row per block row).
        rngs: the step's randomness (sampling verifiers draw from it, one launch per purpose for
        the rows without a seed; greedy ignores it); a list of each row's `RowRandom` is taken
        as that (`StepRandom.of`)."""

    def tail(self, draft: DraftBatch, rngs: StepRandom) -> Tail | None:
        """The verdict as a `Tail` of the verify forward (computed inside its graph where the
        runner has one; `TargetOutput.tail` is then `verdict_of`'s input), or None: `verify`
        takes the logits (default). rngs: as `verify`'s (a sampling tail draws from them)."""
        return None

    def verdict_of(self, tail: torch.Tensor, draft: DraftBatch) -> Verdict:
        """The verdict from this verifier's `tail` output for `draft`: a chain's, packed
        (`Verdict.packed`, [B, K + 2]), as `chain_tail`s leave it."""
        return packed_verdict(tail, draft.width + 1, draft.confidence)

    def verify_row(self, draft: DraftBatch, target_logits: torch.Tensor, rng: RowRandom | None = None) -> RowVerdict:
        """One sequence's draft (a batch of one row) against its logits [n, V], on the host."""
        batch = draft.on(target_logits.device)
        return self.verify(batch, target_logits[None], [rng or RowRandom(0)]).to_host()[0]


def drafted(draft: DraftBatch) -> torch.Tensor:
    """[B, W] bool: the columns each row really drafted."""
    columns = torch.arange(draft.width, device=draft.tokens.device)
    return columns[None] < draft.num_draft[:, None]


def leading(ok: torch.Tensor) -> torch.Tensor:
    """[B, W] bool -> [B] int64: the length of each row's leading run of True."""
    return ok.long().cumprod(1).sum(1)


def chain_verdict(draft: DraftBatch, num_accepted: torch.Tensor, next_tokens: torch.Tensor) -> Verdict:
    """ids [B, W + 1]: the accepted draft tokens, then next_tokens [B] (recovered or bonus), -1 after."""
    rows = draft.rows
    columns = torch.arange(draft.width + 1, device=draft.tokens.device)
    padded = torch.cat([draft.tokens, torch.zeros(rows, 1, dtype=torch.long, device=draft.tokens.device)], 1)
    ids = torch.where(columns[None] < num_accepted[:, None], padded, PAD)
    ids.scatter_(1, num_accepted[:, None], next_tokens[:, None])
    return Verdict(ids, num_accepted, draft.num_draft, None, draft.confidence)


def block_ids(draft: DraftBatch) -> torch.Tensor:
    """[B, W + 1]: the verify block's ids as a chain verdict's tail reads them (draft token j in
    column j + 1). Column 0, the last committed token, is left 0: no verdict reads it."""
    return torch.nn.functional.pad(draft.tokens, (1, 0))


class TreeRows:
    """A tree batch's structure on the device, from its parents [B, N] (nothing read back): for
    each node, whether it is a real one, its parent's block row, its ancestors-or-self and its
    depth (how many they are)."""

    def __init__(self, parents: torch.Tensor):
        self.size = parents.shape[1]
        self.parents = parents  # [B, N]
        self.real = parents >= -1  # [B, N]: padding nodes (NO_NODE) are never accepted
        self.parent_rows = (parents + 1).clamp_min(0)  # [B, N] (a padding node's: row 0, its verdict masked)
        self.lineage = lineage(parents)  # [B, N, N]: node j is node i's ancestor or itself
        self.depths = self.lineage.sum(-1)  # [B, N]

    def deepest(self, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ok [B, N] -> (nodes accepted [B], the deepest node [B]) of the deepest real node whose
        every ancestor-or-self is ok (any node, with 0 accepted, where none is)."""
        whole = ~(self.lineage & ~(ok & self.real)[:, None, :]).any(2)  # [B, N]
        return torch.where(whole, self.depths, 0).max(1)

    def path_rows(self, node: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Block rows [B, N + 1] of the path to each row's `node` [B], depth first, -1 after
        `count` [B] rows."""
        on_path = self.lineage.gather(1, node[:, None, None].expand(-1, 1, self.size))[:, 0] & (count > 0)[:, None]
        order = torch.where(on_path, self.depths, self.size + 1).argsort(1)  # path nodes first, by depth
        columns = torch.arange(self.size, device=order.device)
        rows = torch.where(columns[None] < count[:, None], order + 1, PAD)
        return F.pad(rows, (0, 1), value=PAD)


def tree_verdict(draft: DraftBatch, tree: TreeRows, ok: torch.Tensor, top: torch.Tensor | None = None,
                 pick=None) -> Verdict:
    """A tree batch's verdict: each row keeps the path to its deepest real node whose whole
    lineage is ok [B, N], then its next token: top [B, N + 1]'s at the block row after the path,
    or pick(end rows [B]) -> [B]."""
    count, node = tree.deepest(ok)
    end = torch.where(count > 0, node + 1, 0)  # [B] the block row that predicts the next token
    next_token = top.gather(1, end[:, None])[:, 0] if pick is None else pick(end)
    path = tree.path_rows(node, count)  # [B, N + 1]
    nodes = (path - 1).clamp_min(0)
    ids = torch.where(path >= 0, F.pad(draft.tokens, (0, 1)).gather(1, nodes), PAD)
    ids = ids.scatter(1, count[:, None], next_token[:, None])
    return Verdict(ids, count, draft.num_draft, path, None)
