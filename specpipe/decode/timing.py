"""Step timing that is true on every device: the wall clock on the CPU, CUDA events on a GPU
(whose kernels run after the host has moved on, so the host's clock would time the queueing)."""

from __future__ import annotations

import time

import torch

from specpipe.types import StepTiming


class Clock:
    """Marks the start of a step, the end of the proposer's cache fill, the end of its proposal
    and the end of its verification; `timing()` is read after the step's host copy, when every
    marked kernel has finished."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def timing(self) -> StepTiming:
        start, filled, proposed, verified = self.marks[-4:]
        if self.cuda:
            verified.synchronize()  # done already: the host copy came after it
            return StepTiming(filled.elapsed_time(proposed) / 1e3, proposed.elapsed_time(verified) / 1e3,
                              start.elapsed_time(filled) / 1e3)
        return StepTiming(proposed - filled, verified - proposed, filled - start)
