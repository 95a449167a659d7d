"""Cost of one target forward over k new tokens (k = 1: a plain step; k = γ+1: a verify step).

Usage: python benchmarks/verify_cost.py MODEL [PRECISION ...] [--ks=1,5,9,13,17]
Prints, per precision, the median ms of a forward of k tokens on top of a 64-token cache, and
whether the rows of a k-token forward equal one-token forwards (batch invariance: what a target
precision needs for lossless greedy output).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specpipe.models.loader import load_model, resolve
from specpipe.models.quantize import quantize_model
from specpipe.models.runner import LMRunner

KS = (1, 2, 4, 6, 8)


def time_forward(runner: LMRunner, context: list[int], k: int, reps: int = 7) -> float:
    times = []
    for _ in range(reps):
        runner.crop(len(context))
        start = time.perf_counter()
        runner.forward(context[-1:] * 0 + list(range(100, 100 + k)))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def invariance_error(runner: LMRunner, context: list[int], k: int = 6) -> float:
    """max |logits of row i in a k-token forward - logits of the same token fed alone|."""
    ids = list(range(200, 200 + k))
    runner.crop(len(context))
    block = runner.forward(ids)
    runner.crop(len(context))
    single = torch.cat([runner.forward([i]) for i in ids])
    return float((block - single).abs().max())


def main() -> None:
    global KS
    args = [a for a in sys.argv[1:] if not a.startswith("--ks=")]
    KS = next((tuple(int(k) for k in a[5:].split(",")) for a in sys.argv[1:] if a.startswith("--ks=")), KS)
    name, modes = args[0], args[1:] or ["none", "fp16", "int8"]
    context = list(range(1000, 1064))
    print(f"{name}: ms per forward of k new tokens (64 cached), and batch invariance")
    top = 6 if 6 in KS else KS[-1]  # the README's tables: k=6 / k=1
    print("precision | " + " | ".join(f"k={k}" for k in KS) + f" | k={top} / k={KS[0]} | max row error")
    for mode in modes:
        runner = LMRunner(quantize_model(load_model(resolve(name)), mode))
        runner.forward(context)
        ms = [time_forward(runner, context, k) for k in KS]
        err = invariance_error(runner, context)
        print(f"{mode} | " + " | ".join(f"{t:.0f}" for t in ms) + f" | {ms[KS.index(top)] / ms[0]:.2f} | {err:.1e}")
        del runner


if __name__ == "__main__":
    main()
