"""A step's drafts: `DraftBlock` (one row's chain), `DraftTree` (one row's tree) and
`DraftBatch`, every row's draft padded to `[B, W]` with `num_draft [B]`, on the runner's device
(or on the host where the host drafted it). See specpipe/types.py for the verdict side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

@dataclass(frozen=True)
class DraftBlock:
    """One row's chain of γ guessed tokens.

    tokens: [γ] int64. probs: [γ, V] float32 draft distributions the tokens were sampled
    from (after the same temperature/top-k/top-p as the target), or None for a model-free or
    greedy draft, which verifiers treat as one-hot on `tokens` (still lossless).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [γ] the drafter's top probability at each token
    # 0-d int64 on the device: the tokens drafted before the controller's early stop (None: all γ);
    # a drafter that decides on the device where to stop keeps its γ columns and says how many count
    length: torch.Tensor | None = None

    @property
    def gamma(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "DraftBlock":
        return DraftBlock(torch.empty(0, dtype=torch.long, device=device))


@dataclass(frozen=True)
class DraftTree:
    """Several candidate continuations sharing prefixes, verified in ONE target forward.

    tokens: [N] int64 node tokens. parents: N ints (host), the parent node of each (-1: the
    node follows the last committed token); a parent comes before its children and siblings
    carry different tokens. The verify block is [last token, *tokens]: block row 0 is the last
    token, row i+1 is node i. γ is the tree's depth (its longest candidate).
    """

    tokens: torch.Tensor
    parents: tuple[int, ...]
    confidence: torch.Tensor | None = None
    probs = None  # trees are verified greedily or by typical acceptance, never by rejection

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Depth of each node (1 for children of the last committed token)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    @property
    def gamma(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is `node` (-1: the last committed token)."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def ancestry(self) -> torch.Tensor:
        """[N+1, N+1] bool over block rows (on the host): row r may attend to row c (itself, its
        ancestors, row 0)."""
        return ancestry_of(self.parents)

    def leaf_paths(self) -> list[list[int]]:
        """Every root-to-leaf candidate as node indices."""
        leaves = [i for i in range(self.size) if not self.children(i)]
        return [self.path_to(leaf) for leaf in leaves]

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def ancestry_of(parents: tuple[int, ...]) -> torch.Tensor:
    """[N+1, N+1] bool over the block rows of a tree with these parents (row 0: the last token)."""
    allowed = torch.eye(len(parents) + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for node, parent in enumerate(parents):
        if parent >= 0:
            allowed[node + 1] |= allowed[parent + 1]
    return allowed


def depths_of(parents: tuple[int, ...]) -> list[int]:
    """Block-row depths (row 0: 0) of a tree with these parents; a chain of n: 0..n."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent + 1] + 1)
    return depths


@dataclass(frozen=True)
class DraftBatch:
    """Every row's draft for one step, on the device, or on the host where the host drafted it
    (a lookup's: the static step sends the block with its other inputs, and only an eager
    verifier needs the draft on the device: `on`).

    tokens: [B, W] int64, row b's draft in its first num_draft[b] columns (the rest is padding
    the verifier never accepts). num_draft: [B] int64 (a tree: its depth). probs: [B, W, V] float32 or None
    (one-hot drafts). confidence: [B, W] float32 or None. tree: the parents of a tree draft
    (B = 1 only: trees are verified one sequence at a time), whose nodes are `tokens[0]`.
    gammas: the γ each row was asked for (host ints; sampling draws per row from them, so a
    row's randomness never depends on its neighbours' drafts). counts: num_draft as host ints,
    where the host knows it (None: on the device only, e.g. a head's chain that stopped early).
    host: `tokens` on the host, where the host drafted them (a lookup's), else None.
    """

    tokens: torch.Tensor
    num_draft: torch.Tensor
    gammas: tuple[int, ...]
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    tree: tuple[int, ...] | None = None
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
        """This draft with its tokens and lengths on `device` (one copy; itself where they are)."""
        if self.tokens.device == torch.device(device):
            return self
        width = self.width  # [B, W + 1]: tokens, then num_draft, in one copy
        moved = torch.cat([self.tokens, self.num_draft[:, None]], 1).to(device, non_blocking=True)
        return dataclasses.replace(self, tokens=moved[:, :width], num_draft=moved[:, width])

    @staticmethod
    def empty(rows: int, device: torch.device | str) -> "DraftBatch":
        return DraftBatch(torch.empty(rows, 0, dtype=torch.long, device=device),
                          torch.zeros(rows, dtype=torch.long, device=device), (0,) * rows, counts=(0,) * rows,
                          host=torch.empty(rows, 0, dtype=torch.long))

    @staticmethod
    def of_rows(rows: list[int], size: int, tokens: torch.Tensor, num_draft: torch.Tensor, gammas: list[int],
                probs: torch.Tensor | None = None, confidence: torch.Tensor | None = None) -> "DraftBatch":
        """Drafts of batch rows `rows` made together (tokens [A, W], num_draft [A], probs
        [A, W, V], confidence [A, W], on the device) -> the batch of `size` rows, the others
        without a draft: padded as `stack` pads, one copy a part (all rows: the tensors as they are)."""
        if rows == list(range(size)):
            return DraftBatch(tokens, num_draft, tuple(gammas), probs, confidence)
        index = torch.tensor(rows).to(tokens.device, non_blocking=True)

        def spread(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.new_zeros(size, *t.shape[1:]).index_copy_(0, index, t)

        return DraftBatch(spread(tokens), spread(num_draft), tuple(gammas), spread(probs), spread(confidence))

    @staticmethod
    def stack(drafts: list[DraftBlock | DraftTree | None], gammas: list[int], device: torch.device | str,
              vocab: int | None = None) -> "DraftBatch":
        """One draft per row (None: nothing) -> a padded batch. A tree only as the batch's one row."""
        rows = len(drafts)
        trees = [d for d in drafts if isinstance(d, DraftTree)]
        if trees:
            if rows != 1:
                raise ValueError("tree drafts are verified one sequence at a time")
            tree = trees[0]
            return DraftBatch(tree.tokens.to(device)[None], torch.full((1,), tree.gamma, device=device),
                              tuple(gammas), None, _row(tree.confidence, device), tree.parents)
        uniform = _uniform(drafts, gammas)
        if uniform is not None:
            return uniform
        sizes = [0 if d is None else d.gamma for d in drafts]
        width = max(sizes, default=0)
        if all(d is None or d.tokens.device.type == "cpu" for d in drafts):  # drafted on the host: kept there
            host = torch.zeros(rows, width, dtype=torch.long)
            for b, d in enumerate(drafts):
                if d is not None and sizes[b]:
                    host[b, : sizes[b]] = d.tokens
            tokens, num_draft = host, torch.tensor(sizes)  # `on` moves them where an eager verifier needs them
        else:
            tokens = torch.zeros(rows, width, dtype=torch.long, device=device)
            for b, d in enumerate(drafts):
                if d is not None and sizes[b]:
                    tokens[b, : sizes[b]] = d.tokens
            num_draft, host = torch.tensor(sizes, dtype=torch.long).to(device, non_blocking=True), None
        counts = tuple(sizes)
        for b, d in enumerate(drafts):
            if isinstance(d, DraftBlock) and d.length is not None:
                num_draft[b] = d.length  # a device copy: no read
                counts = None
        probs = confidence = None
        if any(d is not None and d.probs is not None for d in drafts):
            probs = torch.zeros(rows, width, vocab, device=device)
            for b, d in enumerate(drafts):
                if d is not None and d.probs is not None:
                    probs[b, : sizes[b]] = d.probs
        if any(d is not None and d.confidence is not None for d in drafts):
            confidence = torch.zeros(rows, width, device=device)
            for b, d in enumerate(drafts):
                if d is not None and d.confidence is not None and sizes[b]:
                    confidence[b, : sizes[b]] = d.confidence
        return DraftBatch(tokens, num_draft, tuple(gammas), probs, confidence, counts=counts, host=host)


PARTS = ("probs", "confidence", "length")  # a DraftBlock's optional parts


def _uniform(drafts: list, gammas: list[int]) -> DraftBatch | None:
    """Rows that are all device chains of one width with the same parts (a head's graphed
    chains, each γ long with its count): stacked, one launch a part, where padding takes two a
    row; one row is viewed as a batch, no launch (a graphed chain's outputs live until its
    next replay, after this step's verdict). None where the rows differ."""
    first = drafts[0] if drafts else None
    if not isinstance(first, DraftBlock) or first.gamma == 0 or first.tokens.device.type == "cpu":
        return None
    shape = [getattr(first, part) is None for part in PARTS]
    if not all(isinstance(d, DraftBlock) and d.gamma == first.gamma and [getattr(d, part) is None for part in PARTS]
               == shape for d in drafts):
        return None
    tokens, probs, confidence, length = (
        None if getattr(first, part) is None else _batched([getattr(d, part) for d in drafts])
        for part in ("tokens", *PARTS))
    if length is None:  # every row drafted its γ
        return DraftBatch(tokens, torch.full((len(drafts),), first.gamma, device=tokens.device), tuple(gammas),
                          probs, confidence, counts=(first.gamma,) * len(drafts))
    return DraftBatch(tokens, length, tuple(gammas), probs, confidence)


def _batched(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0][None] if len(parts) == 1 else torch.stack(parts)


def _row(t: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if t is None else t.to(device)[None]
