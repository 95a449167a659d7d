"""The GPU check's bench table: per `specpipe bench` folder, the plain and speculative tok/s,
the median speedup with its range, τ and how many outputs were exact.
    python benchmarks/gpu_report.py DIR [DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def line(folder: Path) -> str:
    results = folder / "results.json"
    if not results.is_file():
        return f"| {folder.name} | no results (see its log) | | | | | |"
    payload = json.loads(results.read_text())
    overall, step = payload["summary"]["overall"], payload.get("engine", {}).get("step", "eager")
    speedup, exact = overall["speedup"], overall.get("exactness", {})
    return (f"| {folder.name} | {step} | {overall['baseline_tokens_per_s']:.1f} | {overall['tokens_per_s']:.1f} | "
            f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f}) | "
            f"{overall.get('mean_accepted_length', float('nan')):.2f} | {exact.get('identical')}/{exact.get('of')} |")


def main(folders: list[str]) -> None:
    print("| bench | steps | plain tok/s | spec tok/s | speedup (median, min-max) | τ | exact |")
    print("|---|---|---|---|---|---|---|")
    for folder in folders:
        print(line(Path(folder)))


if __name__ == "__main__":
    main(sys.argv[1:])
