"""A step's draft: `DraftBatch`, every row's draft padded to `[B, W]` with `num_draft [B]`, on the
runner's device (or on the host where the host drafted it), chains or trees alike; and the tree
structure a verifier and a runner read from a tree's parents, on the device (`lineage`,
`block_depths`, `block_ancestry`). See specpipe/types.py for the verdict side.

A tree draft is its parents, [B, N] int64 beside the tokens [B, N] on the draft's device: node
i of row b follows node parents[b, i] (-1: the row's last committed token); a parent comes
before its children, and siblings carry different tokens. A row with fewer nodes than N is
padded with `NO_NODE` parents: a padding node hangs off nothing, sees only row 0 and itself, and
is never accepted (a verifier masks it, whatever its token). A chain of n is the tree
-1, 0, ..., n - 2. Nothing here reads a value back to the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NO_NODE = -2  # a tree row's padding node (its parent): never accepted, attends to row 0 and itself


def lineage(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: node j is node i's ancestor or i itself, from parents [B, N] on their
    device: the parent relation closed by boolean matrix squaring (log2 N matmuls, no read)."""
    n = parents.shape[1]
    nodes = torch.arange(n, device=parents.device)
    reach = ((parents[..., None] == nodes) | (nodes[:, None] == nodes)).float()  # [B, N, N]: parent or self
    for _ in range(max(n - 2, 0).bit_length()):  # paths of up to 2^k edges; the deepest has N - 1
        reach = (reach @ reach).clamp_max_(1.0)  # 0/1 entries, sums <= N: exact in float32 (and TF32)
    return reach > 0


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] int64: each node's depth (1 for a child of the last committed token; a padding node's is 1)."""
    return lineage(parents).sum(-1)


def tree_depth(parents: torch.Tensor) -> torch.Tensor:
    """[B] int64: each row's deepest real node (0 for a row of padding alone): its γ."""
    if parents.shape[1] == 0:
        return parents.new_zeros(parents.shape[0])
    return torch.where(parents >= -1, node_depths(parents), 0).max(1).values


def block_depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N + 1] int64: each verify block row's position past the row's last committed token
    (row 0 that token: 0; row i + 1 node i: its depth)."""
    return F.pad(node_depths(parents), (1, 0))


def block_ancestry(parents: torch.Tensor) -> torch.Tensor:
    """[B, N + 1, N + 1] bool over block rows: row r may attend to row c (itself, its ancestors,
    row 0)."""
    seen = F.pad(lineage(parents), (1, 0, 1, 0))  # [B, N + 1, N + 1]
    seen[:, :, 0] = True
    return seen


def chain_parents(num_draft: torch.Tensor, width: int) -> torch.Tensor:
    """[B, W]: chains of num_draft [B] tokens as trees (-1, 0, 1, ...), padding after."""
    columns = torch.arange(width, device=num_draft.device)
    return torch.where(columns[None] < num_draft[:, None], columns[None] - 1, NO_NODE)


@dataclass(frozen=True)
class DraftBatch:
    """Every row's draft for one step, on the device, or on the host where the host drafted it
    (a lookup's: the static step sends the block with its other inputs, and only an eager
    verifier needs the draft on the device: `on`).

    tokens: [B, W] int64, row b's draft in its first num_draft[b] columns (a chain; the rest is
    padding the verifier never accepts), or a tree's nodes. num_draft: [B] int64 (a tree: each
    row's depth). probs: [B, W, V] float32 draft distributions the tokens were sampled from, or
    None: one-hot drafts (model-free or greedy; still lossless). confidence: [B, W] float32 (the
    drafter's top probability at each token) or None. tree: a tree's parents [B, W] int64 on
    the tokens' device (see the module), or None for chains. gammas: the γ each row was asked
    for (host ints; sampling draws per row from them, so a row's randomness never depends on its
    neighbours' drafts). counts: num_draft as host ints, where the host knows it (None: on the
    device only, e.g. a head's chain that stopped early). host: `tokens` on the host, where the
    host drafted them (a lookup's), else None.
    """

    tokens: torch.Tensor
    num_draft: torch.Tensor
    gammas: tuple[int, ...]
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    tree: torch.Tensor | None = None
    counts: tuple[int, ...] | None = None
    host: torch.Tensor | None = None

    @property
    def width(self) -> int:
        """W: draft columns (host; the verify block is W + 1 wide)."""
        return self.tokens.shape[1]

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    def on(self, device: torch.device | str) -> "DraftBatch":
        """This draft with its tokens, lengths and tree on `device` (one copy; itself where they are)."""
        if self.tokens.device == torch.device(device):
            return self
        width = self.width  # [B, W + 1 (+ W)]: tokens, num_draft, a tree's parents, in one copy
        parts = [self.tokens, self.num_draft[:, None]] + ([] if self.tree is None else [self.tree])
        moved = torch.cat(parts, 1).to(device, non_blocking=True)
        tree = None if self.tree is None else moved[:, width + 1 :]
        return dataclasses.replace(self, tokens=moved[:, :width], num_draft=moved[:, width], tree=tree)

    def parents(self) -> torch.Tensor:
        """[B, W]: the tree's parents, or this batch's chains as trees."""
        return self.tree if self.tree is not None else chain_parents(self.num_draft, self.width)

    def cut(self, size: int) -> "DraftBatch":
        """A tree batch's first `size` nodes of every row (parents come before their children, so
        a prefix is a tree), its depths recomputed where the parents are: no read."""
        if self.tree is None or self.width <= size:
            return self
        tree = self.tree[:, :size]
        confidence = None if self.confidence is None else self.confidence[:, :size]
        host = None if self.host is None else self.host[:, :size]
        return DraftBatch(self.tokens[:, :size], tree_depth(tree), self.gammas, None, confidence, tree, host=host)

    @staticmethod
    def empty(rows: int, device: torch.device | str) -> "DraftBatch":
        return DraftBatch(torch.empty(rows, 0, dtype=torch.long, device=device),
                          torch.zeros(rows, dtype=torch.long, device=device), (0,) * rows, counts=(0,) * rows,
                          host=torch.empty(rows, 0, dtype=torch.long))

    @staticmethod
    def of_lists(gammas: list[int], tokens: list[list[int] | None],
                 parents: list[list[int] | None] | None = None) -> "DraftBatch":
        """Drafts made on the host, one list of tokens per row (None or empty: nothing), and
        for a tree row its parents (None: a chain) -> the batch's host tensors, padded: a tree
        batch where any row is a tree (its chains as trees), else chains. One small tensor a
        part; `on` moves them where an eager verifier needs them."""
        sizes = [len(row) if row else 0 for row in tokens]
        width = max(sizes, default=0)
        host = torch.zeros(len(tokens), width, dtype=torch.long)  # [B, W]
        for b, row in enumerate(tokens):
            if sizes[b]:
                host[b, : sizes[b]] = torch.tensor(row, dtype=torch.long)
        shapes = [None if parents is None or not sizes[b] else parents[b] for b in range(len(tokens))]
        trees = [p for p, n in zip(shapes, sizes) if p is not None and list(p) != list(range(-1, n - 1))]
        if not trees or width == 0:
            return DraftBatch(host, torch.tensor(sizes), tuple(gammas), counts=tuple(sizes), host=host)
        tree = torch.full((len(tokens), width), NO_NODE, dtype=torch.long)  # [B, W]
        depths = []
        for b, n in enumerate(sizes):
            row = list(shapes[b]) if shapes[b] is not None else list(range(-1, n - 1))
            tree[b, :n] = torch.tensor(row, dtype=torch.long)
            depth = []  # host ints: the lists are the host's
            for parent in row:
                depth.append(1 if parent < 0 else depth[parent] + 1)
            depths.append(max(depth, default=0))
        return DraftBatch(host, torch.tensor(depths), tuple(gammas), tree=tree, counts=tuple(depths), host=host)

    @staticmethod
    def of_rows(rows: list[int], size: int, tokens: torch.Tensor, num_draft: torch.Tensor, gammas: list[int],
                probs: torch.Tensor | None = None, confidence: torch.Tensor | None = None,
                tree: torch.Tensor | None = None) -> "DraftBatch":
        """Drafts of batch rows `rows` made together (tokens [A, W], num_draft [A], probs
        [A, W, V], confidence [A, W], a tree's parents [A, W], on the device) -> the batch of
        `size` rows, the others without a draft (no tokens; a tree's: padding nodes), one copy
        a part (all rows: the tensors as they are)."""
        if rows == list(range(size)):
            return DraftBatch(tokens, num_draft, tuple(gammas), probs, confidence, tree)
        index = torch.tensor(rows).to(tokens.device, non_blocking=True)

        def spread(t: torch.Tensor | None, fill: int = 0) -> torch.Tensor | None:
            return None if t is None else t.new_full((size, *t.shape[1:]), fill).index_copy_(0, index, t)

        return DraftBatch(spread(tokens), spread(num_draft), tuple(gammas), spread(probs), spread(confidence),
                          spread(tree, NO_NODE))

    def merged(self, rows: list[int], other: "DraftBatch") -> "DraftBatch":
        """This batch (every row's, drafted on the host: a lookup's) with rows `rows` replaced by
        `other`'s A rows, in order (drafted apart, on the device: a head's), on other's device:
        the wider width, a tree where either is (chains as trees), probabilities where either has
        them (the other rows one-hot on their tokens: what a verifier takes a draft without them
        for), confidence where either has it (0 where a row has none). No read."""
        device, width = other.tokens.device, max(self.width, other.width)
        index = torch.tensor(rows).to(device, non_blocking=True)

        def joined(mine: torch.Tensor, theirs: torch.Tensor, fill=0) -> torch.Tensor:
            mine = F.pad(mine, (0, 0) * (mine.dim() - 2) + (0, width - mine.shape[1]), value=fill)
            mine = mine.to(device, theirs.dtype)  # a head's in its own precision
            theirs = F.pad(theirs, (0, 0) * (theirs.dim() - 2) + (0, width - theirs.shape[1]), value=fill)
            return mine.index_copy(0, index, theirs)

        tokens = joined(self.tokens, other.tokens)
        num_draft = self.num_draft.to(device).index_copy(0, index, other.num_draft)
        tree = None
        if self.tree is not None or other.tree is not None:
            tree = joined(self.parents(), other.parents(), NO_NODE)
        confidence = None
        if self.confidence is not None or other.confidence is not None:
            confidence = joined(*(b.confidence if b.confidence is not None else b.tokens.new_zeros(b.tokens.shape,
                                  dtype=torch.float32) for b in (self, other)))
        probs = None
        if self.probs is not None or other.probs is not None:
            vocab = (other.probs if other.probs is not None else self.probs).shape[-1]
            probs = joined(*(b.probs if b.probs is not None else F.one_hot(b.tokens, vocab).float()
                             for b in (self, other)))
        counts = None
        if self.counts is not None and other.counts is not None:
            counts = list(self.counts)
            for b, count in zip(rows, other.counts):
                counts[b] = count
            counts = tuple(counts)
        return DraftBatch(tokens, num_draft, self.gammas, probs, confidence, tree, counts,
                          tokens if device.type == "cpu" else None)
