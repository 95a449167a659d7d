"""`compile=true`: the native engine's decoder stack under `torch.compile` (inductor).

Two graphs serve every block size and cache width: dynamo compiles with dynamic shapes but
specialises a dimension of size 1, so one-token steps get their own graph; a generation's
prefill and first step compile both, and decoding never compiles again (`graphs_compiled()` counts, a test
checks). Inductor's artefacts go to its on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, default under
the specpipe cache), so a second process loads them instead of compiling. What it buys is
measured in docs/engine.md (benchmarks/engine.py): it is off by default unless it pays.
"""

from __future__ import annotations

import os
import time

import torch

from specpipe.models.zoo import cache_root


class CompiledStack:
    """Wraps `NativeLM.stack`: dynamic-shape compiled, with its first-call time kept for bench
    to report."""

    def __init__(self, stack, cpp_wrapper: bool = False):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
        import torch._inductor.config as inductor
        import torch.fx.experimental._config as fx_config

        inductor.cpp_wrapper = cpp_wrapper
        # a prefill from an empty cache has width == block size: without this, dynamo would
        # assume the two always match and compile again at the first step that breaks it
        fx_config.use_duck_shape = False
        self.eager = stack
        self.compiled = torch.compile(stack, dynamic=True, fullgraph=True)
        self.compile_s: float | None = None  # wall time of the first call (compile or cache load)

    def __call__(self, x, cos, sin, bias, slots, caches, hidden, rows=None):
        if rows is not None:  # exact precisions attend row by row over Python-int widths: eager
            return self.eager(x, cos, sin, bias, slots, caches, hidden, rows)
        started = time.perf_counter()
        out = self.compiled(x, cos, sin, bias, slots, caches, hidden)
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - started
        return out


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
