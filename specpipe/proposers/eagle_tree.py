"""EAGLE-2's dynamic draft tree as device tensors (no head, no cache: the search's bookkeeping).

The search grows a tree depth by depth: the `k` best nodes of the last depth (by cumulative
log-probability) are fed to the head as one block of `k` rows, and each proposes its `k` best
children. Every depth adds a fixed number of nodes, so the node arrays are preallocated, each
depth's nodes are contiguous, and nothing here needs the host: the expanded nodes are a
`topk`, their attention rows a boolean gather, the kept nodes a stable sort. The kept tree's
parents stay on the device too: the runner and the verifier build their masks and paths from
them there (specpipe/drafts.py), so a tree step reads nothing back but its verdict.
"""

from __future__ import annotations

import torch


class TreeSearch:
    def __init__(self, k: int, depth: int, root: torch.Tensor, values: torch.Tensor, ids: torch.Tensor):
        """k: children per expanded node and nodes expanded per depth; depth: the deepest level;
        root [H]: the head's guess that proposed the first level, values / ids [k] its best
        log-probabilities and tokens."""
        self.k = k
        total = k + max(depth - 1, 0) * k * k  # nodes if every depth is searched
        device = root.device
        self.scores = torch.full((total,), float("-inf"), device=device)  # [M] cumulative log-probability
        self.tokens = torch.zeros(total, dtype=torch.long, device=device)  # [M]
        self.parents = torch.full((total,), -1, dtype=torch.long, device=device)  # [M] node index, -1: the root
        self.depths = torch.zeros(total, dtype=torch.long, device=device)  # [M] 1 for the first level
        self.made = 0  # nodes made so far (host: every depth makes k·k)
        self.expanded = 0  # depths expanded (each adds k head rows after the committed ones)
        rows = max(depth - 1, 0) * k
        # the last level's nodes: the guess that predicted each [f, H], and which drafting rows
        # (expanded ancestors) each may attend to [f, rows]
        self.features = root.expand(k, -1)
        self.sees = torch.zeros(k, rows, dtype=torch.bool, device=device)
        self.start = 0
        self._add(values, ids, None, 1)

    def _add(self, values: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor | None, depth: int) -> None:
        n = values.numel()
        span = slice(self.made, self.made + n)
        self.scores[span], self.tokens[span], self.depths[span] = values.reshape(-1), ids.reshape(-1), depth
        if parents is not None:
            self.parents[span] = parents
        self.start, self.made = self.made, self.made + n

    def best(self) -> torch.Tensor:
        """[k] indices into the last level of its k best nodes, the next to expand."""
        return self.scores[self.start : self.made].topk(self.k).indices

    def fed(self, best: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The expanded nodes' head rows: (guesses [k, H] that predicted them, their tokens [k])."""
        return self.features[best], self.tokens[self.start + best]

    def slot_mask(self, best: torch.Tensor, start: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The expanded nodes' mask over a head cache of slots, the drafted rows at slots start,
        start + 1, ...: [1, k, S] bool over slots [S] (the committed rows before `start`, 0-d on
        the device; each node's expanded ancestors; itself)."""
        drafted = self.expanded * self.k
        offset = slots - start  # [S] each slot's place among the drafted rows (< 0: committed)
        seen = torch.zeros(self.k, len(slots), dtype=torch.bool, device=best.device)
        if drafted:
            ancestors = self.sees[best, :drafted]  # [k, drafted]
            seen = ancestors.gather(1, offset.clamp(0, drafted - 1).expand(self.k, -1)) & (offset < drafted)
        own = offset == drafted + torch.arange(self.k, device=best.device)[:, None]  # [k, S]
        return ((offset < 0) | seen | own)[None]

    def grow(self, best: torch.Tensor, guesses: torch.Tensor, values: torch.Tensor, ids: torch.Tensor) -> None:
        """The expanded nodes' children: guesses [k, H] the head's outputs for them, values / ids
        [k, k] each one's best log-probabilities and tokens."""
        nodes = self.start + best  # [k]
        sees = self.sees[best].clone()  # [k, rows]: each expanded node also sees its own row
        own = self.expanded * self.k + torch.arange(self.k, device=best.device)
        sees[torch.arange(self.k, device=best.device), own] = True
        depth = self.expanded + 2
        self.expanded += 1
        self._add(self.scores[nodes, None] + values, ids, nodes.repeat_interleave(self.k), depth)
        self.features = guesses.repeat_interleave(self.k, 0)  # [k·k, H]
        self.sees = sees.repeat_interleave(self.k, 0)  # [k·k, rows]

    def rerank(self, keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The `keep` best nodes, parents before children (by depth, then score). A child scores
        at most its parent and is deeper, so ranking by (score, then depth) keeps the tree closed."""
        return rerank(self.scores[: self.made], self.tokens[: self.made], self.parents[: self.made],
                      self.depths[: self.made], keep)


def rerank(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
           keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nodes [M] (parents: node index, -1 the root) -> the tree of the `keep` best by score
    (ancestors first on ties), ordered by depth then score: its tokens, parents (node indices
    into it, -1 the root) and confidence (each node's cumulative probability), [keep] each, on
    the device: nothing is read back."""
    keep = min(keep, scores.numel())
    by_depth = torch.sort(depths, stable=True).indices
    ranked = by_depth[torch.sort(-scores[by_depth], stable=True).indices]  # (-score, depth, node)
    chosen = ranked[:keep]
    chosen = chosen[torch.sort(-scores[chosen], stable=True).indices]
    order = chosen[torch.sort(depths[chosen], stable=True).indices]  # (depth, -score)
    index = torch.full_like(parents, -1)
    index[order] = torch.arange(keep, device=order.device)
    above = parents[order]
    remapped = torch.where(above >= 0, index[above.clamp(min=0)], above)
    return tokens[order], remapped, scores[order].exp()
