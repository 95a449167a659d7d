"""`StepMeter`: what the decode steps cost, per batch size, kept once for every controller.

The step hands each controller's `update` its timing once a step; `Controller.update` records
it here (the step's batch size and the widest draft it verified) before the controller learns
from it, and a controller wrapping another (the guard) hands its inner one the same meter, so
one chain of controllers keeps one record of the same steps. Readers: the guard's plain cost
and reach (controllers/guard.py), the cost model's propose and verify costs (controllers/cost.py).

It is not a clock: the timings come from the step (decode/timing.py: the wall clock on a CPU,
CUDA events on a GPU). A step that captured a CUDA graph (`StepTiming.setup_s`) counts as a step
but teaches no cost: its time is a one-off of the process.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from itertools import islice

from specpipe.types import StepTiming

PLAIN_SAMPLES = 5  # plain steps a batch size's plain cost is the median of
HISTORY = 256  # samples kept per batch size (and block size): more than any reader's window


@dataclass
class Reach:
    """What speculative steps at one batch size could yield at best, every request's (fading)."""

    possible: float = 0.0  # tokens, had every draft been accepted (γ + 1 a step, the widest row's)
    cost: float = 0.0  # their seconds, in plain steps (the proposer's cache fill apart)
    judged: int = 0


class StepMeter:
    def __init__(self, *, overlapped: bool = False, fade: float = 1 - 1 / 64):
        """overlapped: the decode loop queues plain steps ahead of the host (decode/loop.py,
        `overlap`), so a plain step costs its own time, without the host's time before it;
        fade: the weight each speculative step leaves on earlier ones in a batch size's reach."""
        self.overlapped, self.fade = overlapped, fade
        self.steps = 0  # steps recorded (samples are stamped with it)
        self._plain: dict[int, deque] = {}  # batch size -> recent (step, seconds) of plain steps
        self._propose: dict[int, deque] = {}  # batch size -> recent seconds per draft token
        self._verify: dict[tuple[int, int], deque] = {}  # (batch size, block size k) -> recent (step, seconds)
        self._reach: dict[int, Reach] = {}  # batch size -> what its speculative steps could yield at best
        self._fresh: tuple[tuple, dict] | None = None  # verify_samples' answer, until the next step

    def record(self, timing: StepTiming, batch: int, gamma: int) -> None:
        """One step of `batch` rows whose widest verified draft was `gamma` tokens (0: a plain step)."""
        self.steps += 1
        if timing.setup_s:  # a capture's step: a one-off, no sample
            return
        if gamma == 0:  # queued ahead, the host's time between plain steps runs beside the device's
            plain_s = timing.total_s - timing.host_s if self.overlapped else timing.total_s
            self._plain.setdefault(batch, deque(maxlen=PLAIN_SAMPLES)).append((self.steps, plain_s))
        self._verify.setdefault((batch, gamma + 1), deque(maxlen=HISTORY)).append((self.steps, timing.verify_s))
        if gamma > 0:
            self._propose.setdefault(batch, deque(maxlen=HISTORY)).append(timing.propose_s / gamma)
            plain = self.plain_cost(batch)
            if plain is not None:
                self._measure_reach(batch, gamma + 1, (timing.total_s - timing.fill_s) / plain)

    # plain steps
    def plain_cost(self, batch: int) -> float | None:
        """Median seconds of a recent plain step at this batch size (None: none measured)."""
        samples = self._plain.get(batch)
        return statistics.median(s for _, s in samples) if samples else None

    def plain_age(self, batch: int) -> int | None:
        """Steps since the last plain step at this batch size was recorded (None: none yet)."""
        samples = self._plain.get(batch)
        return self.steps - samples[-1][0] if samples else None

    # speculative steps
    def reach(self, batch: int) -> Reach | None:
        return self._reach.get(batch)

    def _measure_reach(self, batch: int, possible: int, cost: float) -> None:
        reach = self._reach.setdefault(batch, Reach())
        reach.possible = self.fade * reach.possible + possible
        reach.cost = self.fade * reach.cost + cost
        reach.judged += 1

    def propose_samples(self, batch: int, window: int) -> list[float]:
        """The last `window` seconds per draft token at this batch size."""
        return _last(self._propose.get(batch, ()), window)

    def verify_samples(self, window: int, memory: int, batch: int | None = None) -> dict[tuple[int, int], list[float]]:
        """(batch size, block size) -> the last `window` verify seconds of each, those of the
        last `memory` steps only (a size measured slow once and not tried since is forgotten);
        batch: that batch size's only (None: every one). Read-only, and computed once a step:
        the cost model asks for it per candidate γ."""
        key = (self.steps, window, memory, batch)
        if self._fresh is None or self._fresh[0] != key:
            fresh = {size: [s for step, s in _last(times, window) if step > self.steps - memory]
                     for size, times in self._verify.items() if batch is None or size[0] == batch}
            self._fresh = key, fresh
        return self._fresh[1]

    def proposed_sizes(self) -> set[int]:
        """Batch sizes with propose samples."""
        return set(self._propose)

    def verified_sizes(self) -> set[int]:
        """Batch sizes with verify samples."""
        return {batch for batch, _ in self._verify}


def _last(samples, count: int) -> list:
    """The last `count` of `samples` (a deque of up to `HISTORY`), oldest first, without copying the rest."""
    return list(islice(reversed(samples), count))[::-1]
