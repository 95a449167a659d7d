"""The GPU check's tables, from `specpipe bench` folders.

    python benchmarks/gpu_report.py DIR [DIR ...]     per run: plain and speculative tok/s, the
        median speedup with its range, τ, exact outputs, and each peer's tok/s (its exact share)
    python benchmarks/gpu_report.py --load DIR        one request load's line: concurrency,
        plain and speculative throughput, their ratio, P99 latency, exact outputs, guard-held steps
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _results(folder: Path) -> dict | None:
    results = folder / "results.json"
    return json.loads(results.read_text()) if results.is_file() else None


def line(folder: Path) -> str:
    payload = _results(folder)
    if payload is None:
        return f"| {folder.name} | no results (see its log) | | | | | | |"
    overall, step = payload["summary"]["overall"], payload.get("engine", {}).get("step", "eager")
    speedup, exact = overall["speedup"], overall.get("exactness", {})
    peers = ", ".join(f"{name} {figures['tokens_per_s']:.1f} ({figures['exactness']['share']:.0%} exact)"
                      for name, figures in overall.get("peers", {}).items()) or "-"
    return (f"| {folder.name} | {step} | {overall['baseline_tokens_per_s']:.1f} | {overall['tokens_per_s']:.1f} | "
            f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f}) | "
            f"{overall.get('mean_accepted_length', float('nan')):.2f} | {exact.get('identical')}/{exact.get('of')} | "
            f"{peers} |")


def load_line(folder: Path) -> str:
    payload = _results(folder)
    if payload is None:
        return f"| {folder.name} | no results (see its log) | | | | | |"
    load = payload["load"]
    plain, spec, exact = load["plain"], load["speculative"], load["exact"]
    return (f"| {load['concurrency']} | {plain['tokens_per_s']:.1f} | {spec['tokens_per_s']:.1f} | "
            f"{spec['tokens_per_s'] / plain['tokens_per_s']:.2f}x | {plain['latency_ms']['p99']:.0f} / "
            f"{spec['latency_ms']['p99']:.0f} | {exact['identical']}/{exact['of']} | "
            f"{spec['guard_held']}/{spec['row_steps']} |")


def main(args: list[str]) -> None:
    if args[:1] == ["--load"]:
        for folder in args[1:]:
            print(load_line(Path(folder)))
        return
    print("| bench | steps | plain tok/s | spec tok/s | speedup (median, min-max) | τ | exact | peers tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for folder in args:
        print(line(Path(folder)))


if __name__ == "__main__":
    main(sys.argv[1:])
