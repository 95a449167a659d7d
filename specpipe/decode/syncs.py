"""Counting reads back to the host while code runs (a diagnostic, for tests and benchmarks).

The decode step promises one copy to the host a step. On a GPU every read of a tensor's value
from Python (`item`, `tolist`, `bool()`, ...) waits for the device; on the CPU the same call is
free but the same code runs, so counting the Python-level calls while a step runs tells how
many times the step would wait on a GPU. `host_reads` patches `torch.Tensor` for the duration
of its block: use it around a step, never in serving code.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def host_reads() -> Iterator[list[str]]:
    """Every read of a tensor back to the host while the block runs, by method name."""
    seen: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name, method):
        def read(self, *args, **kwargs):
            seen.append(name)
            return method(self, *args, **kwargs)
        return read

    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(name, method))
    try:
        yield seen
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def reads_per_step(decoder, requests) -> list[int]:
    """Run `requests` through a `decode.loop.Decoder`, counting the host reads of each step."""
    counts: list[int] = []
    step = decoder._step

    def counted(busy):
        with host_reads() as seen:
            events = list(step(busy))
        counts.append(len(seen))
        return iter(events)

    decoder._step = counted
    try:
        for _ in decoder.run(requests):
            pass
    finally:
        del decoder._step  # the bound method again
    return counts
