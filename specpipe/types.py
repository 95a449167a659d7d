"""The small typed objects passed between the parts of one decode step.

Glossary (docs/concepts.md): the *target* is the model whose output is preserved; the *draft*
is what a proposer guesses; γ (`gamma`) is the number of draft tokens in a step. *accepted*
draft tokens are kept; the *recovered* token is resampled at the first rejection; the *bonus*
token is the extra target token after all γ were accepted. Every step emits accepted + 1 tokens.

A step is batch-first and stays on the runner's device until its one host copy (vLLM's layout):
a `DraftBatch` holds every row's draft padded to `[B, γmax]` with `num_draft [B]`; the verifier
returns a `Verdict` of device tensors (`ids [B, γmax + 1]` padded with -1, `num_accepted [B]`);
`Verdict.to_host()` copies what the host needs in ONE transfer and returns a `RowVerdict` per
row, which stop rules, text, stats and controllers read. `DraftBlock` / `DraftTree` are one
row's draft, as proposers that draft row by row make them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

PAD = -1  # a Verdict's ids past a row's emitted tokens


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


@dataclass(frozen=True)
class Verdict:
    """What one target forward decided about every row's draft, on the device.

    ids: [B, W + 1] int64, row b's emitted tokens (its accepted draft tokens, then the recovered
    or bonus token) in its first num_accepted[b] + 1 columns, PAD after. num_accepted: [B].
    num_draft: [B] (the draft lengths verified). path: [B, W + 1] int64 for a tree, the verify
    block rows of the accepted nodes (PAD after), else None. confidence: [B, W] or None.
    packed: where the verdict was computed in one tensor, [B, K + 2] int64 (K >= W + 1): ids
    (PAD-padded to K columns), num_accepted, num_draft, which the others view (`packed_verdict`):
    copied to the host as it is.
    """

    ids: torch.Tensor
    num_accepted: torch.Tensor
    num_draft: torch.Tensor
    path: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    packed: torch.Tensor | None = None

    def to_host(self) -> list["RowVerdict"]:
        """The step's one device-to-host copy: every row's outcome as host ints."""
        return self.copy_to_host().rows()

    def copy_to_host(self) -> "HostCopy":
        """Start `to_host`'s copy without waiting for it: the host may queue more work on the
        device (the next step) before it reads the rows."""
        if self.packed is not None:  # packed where it was computed: no launch to pack it
            packed, width = self.packed, self.packed.shape[1] - 2
        else:
            parts = [self.ids, self.num_accepted[:, None], self.num_draft[:, None]]
            if self.path is not None:
                parts.append(self.path)
            packed, width = torch.cat(parts, 1), self.ids.shape[1]
        confidence, done = self.confidence, None
        if packed.device.type != "cpu":  # pinned and non-blocking; the event marks the copies' end
            packed = _pinned_copy(packed)
            confidence = None if confidence is None else _pinned_copy(confidence)  # float32 as it is: no cast
            done = torch.cuda.Event()
            done.record()
        return HostCopy(packed, confidence, done, width, self.path is not None)


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    """t's copy to pinned host memory, started (non-blocking)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def packed_verdict(packed: torch.Tensor, width: int, confidence: torch.Tensor | None = None) -> Verdict:
    """A chain's verdict from its packed form [B, K + 2] (see `Verdict.packed`), W + 1 = width."""
    block = packed.shape[1] - 2
    return Verdict(packed[:, :width], packed[:, block], packed[:, block + 1], None, confidence, packed)


@dataclass(slots=True)
class HostCopy:
    """A verdict's copy to the host, started: `rows()` waits for that copy alone (not for work
    queued after it) and unpacks it."""

    packed: torch.Tensor  # [B, columns] int64: ids, num_accepted, num_draft (and a tree's path), on the host
    confidence: torch.Tensor | None  # [B, W] the draft's confidence, on the host
    done: object  # a CUDA event recorded after the copies (None on the CPU: nothing was copied)
    width: int
    tree: bool

    def rows(self) -> list["RowVerdict"]:
        if self.done is not None:
            self.done.synchronize()
        packed = self.packed
        if self.confidence is not None:  # on the host: one read of both
            packed = torch.cat([packed.double(), self.confidence.double()], 1)
        return unpack_rows(packed.tolist(), self.width, self.tree, self.confidence is not None)


def unpack_rows(rows: list[list[float]], width: int, tree: bool, confidence: bool) -> list["RowVerdict"]:
    """Host rows of `Verdict.to_host`'s packed copy (the draft's confidence after them) -> one
    RowVerdict each."""
    out = []
    for row in rows:
        ids, n, drafted = [int(v) for v in row[:width]], int(row[width]), int(row[width + 1])
        rest = row[width + 2 :]
        path: tuple[int, ...] = ()
        if tree:
            path, rest = tuple(int(v) for v in rest[:width] if v >= 0), rest[width:]
        conf = tuple(rest[:drafted]) if confidence else ()
        out.append(RowVerdict(n, ids[n], drafted, tuple(ids[:n]), conf, path))
    return out


@dataclass(frozen=True)
class RowVerdict:
    """One row's verdict on the host.

    n_accepted: how many leading draft tokens are kept (0..γ). next_token: the recovered token
    (n_accepted < γ) or the bonus token (n_accepted == γ). gamma: the draft length verified
    (a tree's: its depth).
    """

    n_accepted: int
    next_token: int
    gamma: int
    accepted_tokens: tuple[int, ...] = ()
    confidence: tuple[float, ...] = ()  # the draft's, passed on for controllers that learn from it
    path: tuple[int, ...] = ()  # tree drafts: the verify block rows of the accepted nodes

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted_tokens, self.next_token]

    @property
    def last_row(self) -> int:
        """The verify block row whose prediction is next_token."""
        return self.path[-1] if self.path else self.n_accepted


@dataclass(frozen=True)
class StepTiming:
    """Seconds of one step's phases (CUDA events on a GPU, the wall clock on the CPU).

    fill_s: a proposer bringing its own cache up to rows' committed tokens before drafting (a
    draft model's first draft of a request, or its first after a pause at γ = 0): a one-off,
    the price of starting to speculate rather than of each draft, so controllers read the
    proposal's cost from propose_s alone.

    host_s: from the previous step's verification to this step's start, the host's work between
    steps (the verdict's read, commits, stop rules, text, the consumer of the events): the device
    waits through it, unless the step was queued before the previous one was read (overlapped
    plain decoding), where it comes to the device's own gap. 0 for a sequence's first step.

    setup_s: of the seconds above, those spent capturing CUDA graphs (a shape's, a draft's first
    use): a one-off of the process, not what a step costs, so controllers do not learn costs
    from a step where it is not 0.
    """

    propose_s: float
    verify_s: float
    fill_s: float = 0.0
    host_s: float = 0.0
    setup_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.host_s + self.fill_s + self.propose_s + self.verify_s
