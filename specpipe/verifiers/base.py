"""The verifier interface: `verify(draft, target_logits, rngs) -> Verdict`, batched on the device.

A verifier sees every row's draft at once (`DraftBatch`: `[B, W]` tokens, `num_draft [B]`) and
the target's logits of the verify block (`[B, W + 1, V]`, row i predicting draft token i) and
answers in vLLM's layout: emitted ids `[B, W + 1]` padded with -1 and `num_accepted [B]`, all
tensor ops on the logits' device; nothing here reads a value back to the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specpipe.drafts import DraftBatch, DraftBlock, DraftTree, ancestry_of, depths_of
from specpipe.engine.base import Tail
from specpipe.sampling import RowRandom
from specpipe.types import PAD, RowVerdict, Verdict, packed_verdict


class Verifier(ABC):
    lossless: bool = True  # False only for verifiers that change the output distribution
    verifies_trees: bool = True  # False: tree drafts are refused (a step tells proposers: rows.trees)

    @abstractmethod
    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: list[RowRandom]) -> Verdict:
        """target_logits: [B, W + 1, V]; row i of b is the target's prediction for draft token
        i of row b, row num_draft[b] its bonus position (a tree: one row per block row).
        rngs: each row's randomness (sampling verifiers draw from it; greedy ignores it)."""

    def tail(self, draft: DraftBatch, rngs: list[RowRandom]) -> Tail | None:
        """The verdict as a `Tail` of the verify forward (computed inside its graph where the
        runner has one; `TargetOutput.tail` is then `verdict_of`'s input), or None: `verify`
        takes the logits (default). rngs: as `verify`'s (a sampling tail draws from them)."""
        return None

    def verdict_of(self, tail: torch.Tensor, draft: DraftBatch) -> Verdict:
        """The verdict from this verifier's `tail` output for `draft`: a chain's, packed
        (`Verdict.packed`, [B, K + 2]), as `chain_tail`s leave it."""
        return packed_verdict(tail, draft.width + 1, draft.confidence)

    def verify_row(self, draft: DraftBlock | DraftTree, target_logits: torch.Tensor,
                   rng: RowRandom | None = None) -> RowVerdict:
        """One sequence's draft against its logits [n, V], as a batch of one, on the host."""
        batch = DraftBatch.stack([draft], [draft.gamma], target_logits.device, target_logits.shape[-1])
        batch = batch.on(target_logits.device)
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
    """A tree draft's structure as device tensors (the parents are host ints, so this is built
    without reading anything back): for node i, its parent's block row, its depth, and its
    ancestors-or-self."""

    def __init__(self, parents: tuple[int, ...], device: torch.device):
        self.size = len(parents)
        self.parent_rows = torch.tensor([p + 1 for p in parents], dtype=torch.long).to(device)  # [N]
        self.parents = torch.tensor(parents, dtype=torch.long).to(device)  # [N]
        self.depths = torch.tensor(depths_of(parents)[1:], dtype=torch.long).to(device)  # [N]
        self.lineage = ancestry_of(parents)[1:, 1:].to(device)  # [N, N]: node j is node i's ancestor or itself
        self.depth = max(depths_of(parents))

    def path_rows(self, node: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Block rows [N + 1] of the path to `node` (0-d), depth first, -1 after `count` rows."""
        on_path = self.lineage[node] & (count > 0)
        order = torch.where(on_path, self.depths, self.size + 1).argsort()  # path nodes first, by depth
        rows = torch.where(torch.arange(self.size, device=order.device) < count, order + 1, PAD)
        return torch.cat([rows, rows.new_full((1,), PAD)])


def tree_verdict(draft: DraftBatch, tree: TreeRows, path: torch.Tensor, count: torch.Tensor,
                 next_token: torch.Tensor) -> Verdict:
    """A one-row tree's verdict: path [N + 1] block rows, count 0-d accepted nodes."""
    nodes = (path - 1).clamp_min(0)
    ids = torch.where(path >= 0, torch.cat([draft.tokens[0], draft.tokens.new_zeros(1)])[nodes], PAD)
    ids = ids.scatter(0, count[None], next_token[None])
    return Verdict(ids[None], count[None], draft.num_draft, path[None], None)
