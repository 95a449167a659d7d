"""The small typed objects passed between the parts of one decode step.

Glossary (docs/concepts.md): the *target* is the model whose output is preserved; the *draft*
is what a proposer guesses; γ (`gamma`) is the number of draft tokens in a step. *accepted*
draft tokens are kept; the *recovered* token is resampled at the first rejection; the *bonus*
token is the extra target token after all γ were accepted. Every step emits accepted + 1 tokens.

A step is batch-first and stays on the runner's device until its one host copy (vLLM's layout):
a `DraftBatch` holds every row's draft padded to `[B, γmax]` with `num_draft [B]`; the verifier
returns a `Verdict` of device tensors (`ids [B, γmax + 1]` padded with -1, `num_accepted [B]`);
`Verdict.to_host()` copies what the host needs in ONE transfer and returns a `RowVerdict` per
row, which stop rules, text, stats and controllers read. The drafts' types are in
specpipe/drafts.py; `Rows` is what a step tells its proposer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.sampling import StepRandom

PAD = -1  # a Verdict's ids past a row's emitted tokens


@dataclass(frozen=True)
class Rows:
    """What a step tells a proposer about its rows (every list indexed by batch row).

    tokens: each row's committed tokens (host; a free row's is empty). rngs: the step's
    randomness (`StepRandom`: one draw launch per purpose for the rows without a seed of their
    own; a list of each row's `RowRandom` is taken as that). stop_below: the controller's early
    stop, (draft position) -> stop after it where the drafter's confidence is below this (0.0:
    never). trees: a tree draft may be returned (for any rows: the verifier and the runner take
    trees); else chains only. device: the runner's."""

    tokens: list[list[int]]
    rngs: StepRandom
    stop_below: Callable[[int], float]
    device: torch.device
    trees: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "rngs", StepRandom.of(self.rngs))


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
