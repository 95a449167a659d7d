"""Cost of one target forward over k new tokens (k = 1: a plain step; k = γ+1: a verify step).

Usage: python benchmarks/verify_cost.py MODEL [PRECISION ...] [--ks=1,2,5,9,16] [--engine=native]
       [--context=64] [--tree] [--device=cpu]
       python benchmarks/verify_cost.py MODEL [exact] [fast] --engine=llamacpp   (kernels instead of precisions)
Prints, per precision, the median ms of a forward of k tokens on top of a `context`-token cache
(on a GPU the clock waits for the device before and after: the logits stay on it),
and whether the rows of a k-token forward equal one-token forwards (batch invariance: what a
target precision needs for lossless greedy output; `bitwise` is what the exact precisions
promise). --tree: each k-token block is a tree verify instead (the last token and k - 1 nodes,
three children a node, as EAGLE-2's trees branch), timed only.
Run it alone on the machine: its figures are timings.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specpipe.engine import make_runner
from specpipe.models.loader import load_model, resolve

KS = (1, 2, 5, 9, 16)
CONTEXT = list(range(1000, 1064))


def tree_parents(k: int) -> tuple[int, ...] | None:
    """The parents of a verify block of the last token and k - 1 nodes, three children a node."""
    if k < 2:
        return None
    return tuple(j // 3 - 1 for j in range(k - 1))


def ids_block(runner, ids: list[int]) -> torch.Tensor:
    """One row of token ids, [1, n], on the runner's device."""
    return torch.tensor([ids]).to(runner.device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(runner, k: int, reps: int = 7, tree: bool = False) -> float:
    """Median ms of a k-token forward after the context (the first call, kernel set-up, dropped)."""
    times = []
    parents = tree_parents(k) if tree else None
    block = ids_block(runner, list(range(100, 100 + k)))
    for _ in range(reps):
        runner.crop(0, len(CONTEXT))
        _sync(runner.device)
        start = time.perf_counter()
        runner.forward(block, tree=parents)
        _sync(runner.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def invariance_error(runner, k: int = 9) -> tuple[float, bool]:
    """(max |logits of row i in a k-token forward - the same token fed alone|, bitwise equal)."""
    ids = list(range(200, 200 + k))
    runner.crop(0, len(CONTEXT))
    block = runner.forward(ids_block(runner, ids)).logits[0]
    runner.crop(0, len(CONTEXT))
    single = torch.cat([runner.forward(ids_block(runner, [i])).logits[0] for i in ids])
    return float((block - single).abs().max()), torch.equal(block, single)


def main() -> None:
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--") and "=" in a}
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ks = tuple(int(k) for k in flags["--ks"].split(",")) if "--ks" in flags else KS
    engine = flags.get("--engine", "native")
    device = flags.get("--device", "cpu")
    tree = "--tree" in sys.argv[1:]
    CONTEXT[:] = range(1000, 1000 + int(flags.get("--context", 64)))
    llamacpp = engine == "llamacpp"  # the GGUF itself, run with each kernel choice
    name, modes = args[0], args[1:] or (["exact", "fast"] if llamacpp else ["fp16", "bf16", "w8a16"])
    model = resolve(name) if llamacpp else load_model(resolve(name))
    print(f"{name} ({engine} engine): ms per forward of k new tokens{' as a tree' if tree else ''} "
          f"({len(CONTEXT)} cached), and batch invariance")
    print("precision | " + " | ".join(f"k={k}" for k in ks) + f" | k={ks[-1]} / k={ks[0]} | max row error | bitwise")
    for mode in modes:
        options = {"kernels": mode} if llamacpp else {"precision": mode}
        runner = make_runner(model, engine=engine, cache_len=len(CONTEXT) + 64, device=device, **options)
        runner.prefill(0, CONTEXT)
        ms = [time_forward(runner, k, tree=tree) for k in ks]
        err, bitwise = invariance_error(runner)
        print(f"{mode} | " + " | ".join(f"{t:.1f}" for t in ms) + f" | {ms[-1] / ms[0]:.2f} | {err:.1e} | {bitwise}")
        del runner


if __name__ == "__main__":
    main()
