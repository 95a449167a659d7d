"""CUDA graphs over persistent buffers: a computation captured once per shape, replayed after.

Every graphed part of a decode step (the target's static step, a draft model's steps through
the same, Medusa's heads, an EAGLE head's draft chain) is a `compute` over buffers its owner
keeps and refills in place before each call: no host read inside, no tensor created from host
values, no shape that depends on a value. A `Graphs` keeps one component's graphs by key (its
shape); on a GPU the first call of a key captures it, every call replays it and returns the
graph's own output tensors, which the next replay rewrites. On the CPU nothing is captured and
`run` calls `compute` itself, so the same code path is what the tests check here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import torch

from specpipe.errors import SpecpipeError

_captured = [0.0]  # wall seconds this process has spent capturing graphs (warm-ups included)


def captured_s() -> float:
    """Wall seconds spent capturing CUDA graphs in this process so far: a one-off, which a step
    that captured reports as its `StepTiming.setup_s` (decode/timing.py), so that controllers
    do not take it for what a step costs."""
    return _captured[0]


def capture(compute: Callable[[], Any], device: torch.device, pool=None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`compute` captured as a CUDA graph -> (graph, its outputs). torch's recipe: one warm-up
    run on a side stream first, so lazy library set-up (cuBLAS handles, workspaces) stays out of
    the graph. The warm-up computes with the buffers' current values, and so writes what a replay
    would (caches included); the capture itself runs nothing. `pool`: the memory pool shared
    with the owner's other graphs."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        compute()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    stream, failed = torch.cuda.current_stream(device), []
    try:
        with torch.cuda.graph(graph, pool=pool):
            try:
                out = compute()
            except RuntimeError as err:
                failed.append(err)  # the ending capture raises its own error over this one
                raise
    except RuntimeError as err:  # an operation a stream cannot capture (a sync, a host read)
        cause = failed[0] if failed else err
        torch.cuda.set_stream(stream)  # a failed capture's end leaves its own stream current
        raise SpecpipeError(
            f"Capturing a decode step as a CUDA graph failed ({str(cause).splitlines()[0]}). The steps run "
            "without graphs with graphs=off (slower on a GPU, the same output); please report the "
            "model and settings.") from cause
    return graph, out


class Graphs:
    """One component's CUDA graphs by key; `captures` counts them (a test checks that a second
    generation adds none). On the CPU it only runs the computations."""

    def __init__(self, device: torch.device):
        self.device = device
        self.capture = device.type == "cuda"
        self.captures = 0
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = {}
        # one memory pool for all of them (made at the first capture): each graph's outputs stay
        # referenced here, so no capture reuses them, and only their intermediates share memory
        # (the graphs never run at once)
        self._pool = None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def ensure(self, key: Hashable, compute: Callable[[], Any]) -> None:
        """Capture `key` now if it is not yet (a GPU only): a planned shape, before its first use."""
        if self.capture and key not in self._graphs:
            started = time.perf_counter()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            try:
                self._graphs[key] = capture(compute, self.device, self._pool)
            finally:
                _captured[0] += time.perf_counter() - started
            self.captures += 1

    def run(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """`compute`'s outputs: replayed from the key's graph (captured at its first call) on a
        GPU, computed eagerly on the CPU."""
        if not self.capture:
            return compute()
        self.ensure(key, compute)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def clear(self) -> None:
        """Forget every graph (their buffers are gone: a cache grown, a row count changed)."""
        self._graphs.clear()
