"""The before/after table of benchmarks/loop_compare.sh: per bench, the plain and speculative
tokens/s, the median speedup and exactness of each run, and how far the plain target moved
between the two runs (the noise the comparison lives with).
    python benchmarks/loop_compare.py OUT_BEFORE OUT_AFTER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(path: Path) -> dict | None:
    if not (path / "results.json").is_file():
        return None
    data = json.loads((path / "results.json").read_text())
    overall = data["summary"]["overall"]  # per-prompt benches and request loads alike
    exact = overall.get("exactness", {})
    return {"plain": overall["baseline_tokens_per_s"], "spec": overall["tokens_per_s"],
            "speedup": overall["speedup"]["median"], "exact": f"{exact.get('identical')}/{exact.get('of')}"}


def main(before: str, after: str) -> None:
    names = sorted({p.name for p in Path(before).iterdir()} | {p.name for p in Path(after).iterdir()})
    print("| bench | plain tok/s before → after (drift) | spec tok/s before → after | speedup before → after "
          "| exact before / after |")
    print("|---|---|---|---|---|")
    for name in names:
        a, b = row(Path(before) / name), row(Path(after) / name)
        if a is None or b is None:
            print(f"| {name} | missing in {'before' if a is None else 'after'} | | | |")
            continue
        drift = b["plain"] / a["plain"] - 1
        print(f"| {name} | {a['plain']:.1f} → {b['plain']:.1f} ({drift:+.0%}) | {a['spec']:.1f} → {b['spec']:.1f} | "
              f"{a['speedup']:.2f}x → {b['speedup']:.2f}x | {a['exact']} / {b['exact']} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
