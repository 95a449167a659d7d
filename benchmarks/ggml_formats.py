"""ggml's other formats on `engine=llamacpp`: does a Q8_0 or F16 file make verify blocks cheap?

Usage: python benchmarks/ggml_formats.py [MODEL ...] [--formats=q8_0,f16] [--ks=1,2,5,9,16] [--dir=DIR]

Per zoo model, requantizes its GGUF with llama.cpp itself (`llama_model_quantize`, the library
`specpipe install llamacpp` builds; a 4-bit source requantized to Q8_0 or F16 keeps its values,
only their storage and ggml's kernels change), then prints the median ms of a k-token
evaluation on top of 64 cached tokens for the source file and each format (`kernels=exact`, as
`benchmarks/verify_cost.py MODEL --engine=llamacpp` measures it) and the k=5 and k=9 costs over
one token. Speculation pays on a format only where a verify block costs little more than one
token. The requantized files go to --dir (default: a temporary folder, removed afterwards).
Run it alone on the machine: its figures are timings.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specpipe.engine.llamacpp import LlamaCppRunner, library
from specpipe.models import zoo

FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}
CONTEXT = list(range(1000, 1064))


def requantize(source: Path, target: Path, fmt: str) -> None:
    llama = library()
    params = llama.llama_model_quantize_default_params()
    params.nthread, params.ftype, params.allow_requantize = 2, getattr(llama, FTYPES[fmt]), True
    if llama.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not requantize {source} to {fmt}")


def curve(path: Path, ks: list[int], reps: int = 7) -> list[float]:
    """Median ms of a k-token evaluation after the context, per k (first call dropped)."""
    runner = LlamaCppRunner(path, cache_len=len(CONTEXT) + 64, kernels="exact")
    runner.prefill(0, CONTEXT)
    out = []
    for k in ks:
        block = torch.tensor([list(range(100, 100 + k))])
        times = []
        for _ in range(reps):
            runner.crop(0, len(CONTEXT))
            started = time.perf_counter()
            runner.forward(block)
            times.append(time.perf_counter() - started)
        out.append(statistics.median(times[1:]) * 1e3)
    del runner
    return out


def main() -> None:
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--")}
    models = [a for a in sys.argv[1:] if not a.startswith("--")] or ["smollm2-135m"]
    formats = flags.get("--formats", "q8_0,f16").split(",")
    ks = [int(k) for k in flags.get("--ks", "1,2,5,9,16").split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(flags.get("--dir", scratch))
        print("| model | file | " + " | ".join(f"k={k}" for k in ks) + " | 5/1 | 9/1 |")
        print("|---" * (len(ks) + 4) + "|")
        for name in models:
            source = zoo.fetch(name)
            files = [(source.name, source)]
            for fmt in formats:
                target = folder / f"{name}-{fmt}.gguf"
                if not target.exists():
                    requantize(source, target, fmt)
                files.append((fmt.upper(), target))
            for label, path in files:
                ms = curve(path, ks)
                at = dict(zip(ks, ms))
                ratios = [f"{at[k] / at[1]:.2f}" if k in at and 1 in at else "-" for k in (5, 9)]
                print(f"| {name} | {label} | " + " | ".join(f"{t:.1f}" for t in ms) + f" | {' | '.join(ratios)} |",
                      flush=True)


if __name__ == "__main__":
    main()
