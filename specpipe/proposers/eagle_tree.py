"""EAGLE-2's dynamic draft tree as device tensors: its shape (`TreeShape`), the search's
bookkeeping (`TreeSearch`), its batched drive over an EAGLE head (`search`), and the kept tree
(`rerank`, `kept`).

The search grows a tree depth by depth: the `k` best nodes of the last depth (by cumulative
log-probability) are fed to the head as one block of `k` rows, and each proposes its `k` best
children. Every depth adds a fixed number of nodes, so the node arrays are preallocated, each
depth's nodes are contiguous, and nothing here needs the host: the expanded nodes are a
`topk`, their attention rows a boolean gather, the kept nodes a stable sort. The arrays carry
leading batch dimensions (none for one row's search, [A] for A rows searched together, whose
expanded nodes go through the head as one block [A, k] a depth); every row's nodes sit at the
same places, since every depth makes k·k nodes a row. The kept tree's parents stay on the
device too: the runner and the verifier build their masks and paths from them there
(specpipe/drafts.py), so a tree step reads nothing back but its verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.drafts import NO_NODE
from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import SlotCache


@dataclass(frozen=True)
class TreeShape:
    top_k: int = 4  # children per expanded node, and nodes expanded per depth
    nodes: int = 16  # nodes kept after reranking: the size of the verify block (+1)

    def __post_init__(self):
        if self.top_k < 1 or self.nodes < 1:
            raise SpecpipeError(f"proposer.tree needs top_k >= 1 and nodes >= 1 (got top_k={self.top_k}, "
                                f"nodes={self.nodes}), e.g. proposer.tree={{top_k: 4, nodes: 16}}.")


class TreeSearch:
    def __init__(self, k: int, depth: int, root: torch.Tensor, values: torch.Tensor, ids: torch.Tensor):
        """k: children per expanded node and nodes expanded per depth; depth: the deepest level;
        root [..., H]: the head's guesses that proposed the first level (leading dimensions:
        the rows searched together, none for one row), values / ids [..., k] their best
        log-probabilities and tokens."""
        self.k = k
        batch, device = root.shape[:-1], root.device
        total = k + max(depth - 1, 0) * k * k  # nodes a row if every depth is searched
        self.scores = torch.full((*batch, total), float("-inf"), device=device)  # [..., M] cumulative log-probability
        self.tokens = torch.zeros(*batch, total, dtype=torch.long, device=device)  # [..., M]
        self.parents = torch.full((*batch, total), -1, dtype=torch.long, device=device)  # [..., M] node, -1: the root
        self.depths = torch.zeros(total, dtype=torch.long, device=device)  # [M] 1 for the first level, every row's
        self.made = 0  # nodes made a row so far (host: every depth makes k·k)
        self.expanded = 0  # depths expanded (each adds k head rows after the committed ones)
        rows = max(depth - 1, 0) * k
        # the last level's nodes: the guess that predicted each [..., f, H], and which drafting
        # rows (expanded ancestors) each may attend to [..., f, rows]
        self.features = root[..., None, :].expand(*batch, k, -1)
        self.sees = torch.zeros(*batch, k, rows, dtype=torch.bool, device=device)
        self.start = 0
        self._add(values, ids, None, 1)

    def _add(self, values: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor | None, depth: int) -> None:
        """A level's nodes, values / ids / parents [..., n]."""
        n = values.shape[-1]
        span = slice(self.made, self.made + n)
        self.scores[..., span], self.tokens[..., span], self.depths[span] = values, ids, depth
        if parents is not None:
            self.parents[..., span] = parents
        self.start, self.made = self.made, self.made + n

    def best(self) -> torch.Tensor:
        """[..., k] indices into the last level of its k best nodes, the next to expand."""
        return self.scores[..., self.start : self.made].topk(self.k).indices

    def fed(self, best: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The expanded nodes' head rows: (guesses [..., k, H] that predicted them, their tokens [..., k])."""
        features = self.features.gather(-2, best[..., None].expand(*best.shape, self.features.shape[-1]))
        return features, self.tokens[..., self.start : self.made].gather(-1, best)

    def slot_mask(self, best: torch.Tensor, start: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The expanded nodes' mask over a head cache of slots, each row's drafted rows at slots
        start, start + 1, ...: [A, k, S] bool over slots [S] (one row: [1, k, S]), seeing the
        committed rows before the row's `start` ([...] on the device), each node's expanded
        ancestors, and itself."""
        drafted = self.expanded * self.k
        offset = (slots - start[..., None])[..., None, :]  # [..., 1, S] each slot's place among a row's drafted rows
        own = offset == drafted + torch.arange(self.k, device=best.device)[:, None]  # [..., k, S]
        mask = (offset < 0) | own  # committed rows (< 0), and itself
        if drafted:
            ancestors = self._rows(self.sees, best)[..., :drafted]  # [..., k, drafted]
            places = offset.clamp(0, drafted - 1).expand(*best.shape, -1)  # [..., k, S]
            mask |= ancestors.gather(-1, places) & (offset < drafted)
        return mask.reshape(-1, self.k, len(slots))

    def grow(self, best: torch.Tensor, guesses: torch.Tensor, values: torch.Tensor, ids: torch.Tensor) -> None:
        """The expanded nodes' children: guesses [..., k, H] the head's outputs for them, values /
        ids [..., k, k] each one's best log-probabilities and tokens."""
        nodes = self.start + best  # [..., k]
        sees = self._rows(self.sees, best)  # [..., k, rows] (a copy): each expanded node also sees its own row
        own = self.expanded * self.k + torch.arange(self.k, device=best.device)
        sees[..., torch.arange(self.k, device=best.device), own] = True
        depth = self.expanded + 2
        self.expanded += 1
        scores = self.scores.gather(-1, nodes)[..., None] + values  # [..., k, k]
        self._add(scores.flatten(-2), ids.flatten(-2), nodes.repeat_interleave(self.k, -1), depth)
        self.features = guesses.repeat_interleave(self.k, -2)  # [..., k·k, H]
        self.sees = sees.repeat_interleave(self.k, -2)  # [..., k·k, rows]

    @staticmethod
    def _rows(table: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        """table [..., f, C] at the nodes `best` [..., k] -> [..., k, C]."""
        return table.gather(-2, best[..., None].expand(*best.shape, table.shape[-1]))


def search(feed: Callable[..., torch.Tensor], top: Callable, cache: SlotCache, rows, root: torch.Tensor,
           start: torch.Tensor, k: int, widths: list[int]) -> tuple[torch.Tensor, ...]:
    """EAGLE-2's search from the roots [A, H] of A rows together, to depth len(widths) + 1: each
    depth d feeds the k best nodes of every row's last level as one block [A, k], a row's at
    its slots start + (d - 1)·k + [0, k) (start [A]), attending over widths[d - 1] slots through
    its own mask, and takes their k best children: one head forward a depth for every row.
    feed, top: eagle_graph's `Feed` and `Top`; rows: the cache rows (eagle_graph's `CacheRows`,
    which imports this module). -> every node made (scores, tokens, parents [A, M], depths [M])."""
    values, ids = top(root, k)  # [A, k]
    found = TreeSearch(k, len(widths) + 1, root, values, ids)
    columns = torch.arange(k, device=root.device)
    for d, width in enumerate(widths, 1):
        best = found.best()  # [A, k]
        guesses, tokens = found.fed(best)  # [A, k, H], [A, k]
        mask = found.slot_mask(best, start, torch.arange(width, device=root.device))  # [A, k, width]
        slots = (start + (d - 1) * k)[:, None] + columns  # [A, k]
        positions = (start + d - 1)[:, None].expand(-1, k)  # [A, k] one depth: one position
        hidden = feed(guesses, tokens, positions, cache.at(rows.index, rows.first, slots, width), mask)  # [A, k, H]
        found.grow(best, hidden, *top(hidden, k))  # [A, k, k]
    made = slice(0, found.made)
    return found.scores[:, made], found.tokens[:, made], found.parents[:, made], found.depths[made]


def kept(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, k: int,
         rows: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nodes of A rows searched together ([A, M], depths [M]) -> each row's tree as a search to
    its own depth rows[a] alone keeps it (`rerank`), [A, N] each, a row of fewer nodes padded
    with `NO_NODE` parents (token 0, confidence 0). A row's nodes deeper than its depth rank
    last: scored -inf, and deeper than any of its own, they follow even its -inf nodes, so its
    first min(keep, its nodes) are its own tree, in its order. Nothing is read back."""
    deepest = max(rows)
    if min(rows) < deepest:  # rows of a shallower γ: their deeper nodes are not theirs
        cut = torch.tensor(rows).to(scores.device, non_blocking=True)
        scores = scores.masked_fill(depths > cut[:, None], float("-inf"))
    tokens, parents, confidence = rerank(scores, tokens, parents, depths, keep)
    counts = [min(keep, k + (depth - 1) * k * k) for depth in rows]  # each row's own nodes (host)
    if min(counts) == tokens.shape[-1]:
        return tokens, parents, confidence
    own = torch.arange(tokens.shape[-1], device=tokens.device) < torch.tensor(counts).to(tokens.device)[:, None]
    return tokens.where(own, 0), parents.where(own, NO_NODE), confidence.where(own, 0.0)


def rerank(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
           keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nodes [..., M] (parents: node index, -1 the root; depths [..., M] or every row's [M]) ->
    each row's tree of its `keep` best by score (ancestors first on ties), ordered by depth then
    score: its tokens, parents (node indices into it, -1 the root) and confidence (each node's
    cumulative probability), [..., keep] each, on the device: nothing is read back. A child
    scores at most its parent and is deeper, so ranking by (score, then depth) keeps the tree
    closed."""
    keep = min(keep, scores.shape[-1])
    depths = depths.expand_as(scores)
    by_depth = torch.sort(depths, stable=True).indices
    ranked = by_depth.gather(-1, torch.sort(-scores.gather(-1, by_depth), stable=True).indices)  # (-score, depth, node)
    chosen = ranked[..., :keep]  # in score order: sorted by depth, (depth, -score)
    order = chosen.gather(-1, torch.sort(depths.gather(-1, chosen), stable=True).indices)
    index = torch.full_like(parents, -1).scatter_(-1, order, torch.arange(keep, device=order.device).expand_as(order))
    above = parents.gather(-1, order)
    remapped = torch.where(above >= 0, index.gather(-1, above.clamp(min=0)), above)
    return tokens.gather(-1, order), remapped, scores.gather(-1, order).exp()
