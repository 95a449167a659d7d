"""Step timing that is true on every device: the wall clock on the CPU, CUDA events on a GPU
(whose kernels run after the host has moved on, so the host's clock would time the queueing)."""

from __future__ import annotations

import time

import torch

from specpipe.engine.graphs import captured_s
from specpipe.types import StepTiming


class Clock:
    """Marks the start of a step, the end of the proposer's cache fill, the end of its proposal
    and the end of its verification; `timing()` is read after the step's host copy, when every
    marked kernel has finished. `since`: the previous step's clock, so the host's work between
    the two steps (reading, committing, emitting: the device waits through it unless a step was
    queued ahead) counts as this step's `host_s`; None after a prefill, timed apart. Seconds
    spent capturing CUDA graphs from there to the last mark are the step's `setup_s`."""

    def __init__(self, device: torch.device, since: "Clock | None" = None):
        self.cuda = device.type == "cuda"
        # the previous step's end and capture count (not its clock: each would hold the one before)
        self.since = (since.end, since.captured[-1]) if since is not None else None
        self.marks: list = []
        self.captured: list[float] = []  # `graphs.captured_s()` at each mark

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        self.captured.append(captured_s())

    @property
    def end(self):
        """The last mark: the end of verification (what the next step's clock counts from)."""
        return self.marks[-1]

    def timing(self) -> StepTiming:
        start, filled, proposed, verified = self.marks[-4:]
        since, captured = self.since if self.since is not None else (None, self.captured[-4])
        setup = self.captured[-1] - captured
        if self.cuda:
            verified.synchronize()  # done already: the host copy came after it
            host = since.elapsed_time(start) / 1e3 if since is not None else 0.0
            return StepTiming(filled.elapsed_time(proposed) / 1e3, proposed.elapsed_time(verified) / 1e3,
                              start.elapsed_time(filled) / 1e3, host, setup)
        return StepTiming(proposed - filled, verified - proposed, filled - start,
                          start - since if since is not None else 0.0, setup)
