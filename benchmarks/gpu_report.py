"""The GPU check's tables, from `specpipe bench` folders.

    python benchmarks/gpu_report.py DIR [DIR ...]     per run: plain and speculative tok/s, the
        median speedup with its range, τ, exact outputs, and each peer's tok/s (its exact share)
    python benchmarks/gpu_report.py --load DIR        one request load's line: concurrency,
        plain and speculative throughput, their ratio, P99 latency, exact outputs, guard-held steps
    python benchmarks/gpu_report.py --aims DIR        the GPU engine's aims against what the
        check measured under DIR (its bench-*, load-c* folders and engine.json), met or not
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
        return f"| {folder.name} | no results (see its log) | | | | | | | |"
    overall, step = payload["summary"]["overall"], payload.get("engine", {}).get("step", "eager")
    speedup, exact = overall["speedup"], overall.get("exactness", {})
    peers = ", ".join(f"{name} {figures['tokens_per_s']:.1f} ({figures['exactness']['share']:.0%} exact)"
                      for name, figures in overall.get("peers", {}).items()) or "-"
    return (f"| {folder.name} | {step} | {overall['baseline_tokens_per_s']:.1f} | {overall['tokens_per_s']:.1f} | "
            f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f}) | "
            f"{overall.get('mean_accepted_length', float('nan')):.2f} | {exact.get('identical')}/{exact.get('of')} | "
            f"{peers} | {_setup(payload)} |")


def _setup(payload: dict) -> str:
    """Seconds the measured runs spent capturing CUDA graphs (a draft's shapes at first use, after
    the warm-up): one-offs inside their tokens/s, plain / speculative."""
    spent = [sum(prompt[run]["stats"].get("setup_s", 0.0) for prompt in payload.get("prompts", []))
             for run in ("baseline", "speculative")]
    return " / ".join(f"{seconds:.2f}" for seconds in spent)


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


def _engine(rows: list[dict], model: str, config: str) -> dict | None:
    """The engine table's row of `model` in `config` (its planned block, `@N`, aside)."""
    return next((r for r in rows if r["model"] == model and r["config"].split("@")[0] == config), None)


def aims(folder: Path) -> list[tuple[str, str, bool | None]]:
    """(aim, what was measured, met: None where it was not measured)."""
    bench = {name: _results(folder / f"bench-{name}") for name in ("recipe", "ngram", "suffix")}
    engine = [row for path in sorted(folder.glob("engine*.json")) for row in json.loads(path.read_text())]
    load = _results(folder / "load-c8")
    out: list[tuple[str, str, bool | None]] = []

    def add(aim: str, value: float | None, target: float, text: str, most: bool = False) -> None:
        met = None if value is None else (value <= target if most else value >= target)
        out.append((aim, "not measured" if value is None else text.format(value), met))

    recipe = bench["recipe"]["summary"]["overall"] if bench["recipe"] else None
    add("SmolLM2-135M plain >= 1,500 tok/s (real model, the recipe's plain run)",
        recipe and recipe["baseline_tokens_per_s"], 1500, "{:.0f} tok/s")
    for config in ("native:bf16+compile+graphs", "native:bf16+compile+graphs+fast"):
        row = _engine(engine, "smollm2-135m", config)
        add(f"SmolLM2-135M shape plain >= 1,500 tok/s ({config}, random weights)", row and row["plain_tok_s"], 1500,
            "{:.0f} tok/s")
    for config in ("native:bf16+graphs", "native:bf16+graphs+fast", "native:bf16"):
        row = _engine(engine, "qwen2.5-coder-1.5b", config)
        add(f"Qwen2.5-1.5B shape plain >= 1,000 tok/s ({config})", row and row["plain_tok_s"], 1000, "{:.0f} tok/s")
    fast = _engine(engine, "qwen2.5-coder-1.5b", "native:bf16+graphs+fast")
    add("Qwen2.5-1.5B shape: a 9-token verify <= 1.15x a 1-token forward (static fast)",
        fast and fast["verify_9_over_1"], 1.15, "{:.2f}x", most=True)
    add("shipped recipe >= 2x its own plain (median, dev + held-aside)", recipe and recipe["speedup"]["median"], 2.0,
        "{:.2f}x")
    for name in ("ngram", "suffix"):
        overall = bench[name]["summary"]["overall"] if bench[name] else None
        add(f"{name} never below plain on any prompt (worst prompt)", overall and overall["speedup"]["min"], 1.0,
            "{:.2f}x")
    if recipe:
        exact = recipe["exactness"]
        out.append(("every output of the recipe exact", f"{exact['identical']}/{exact['of']}",
                    exact["identical"] == exact["of"]))
    ngram = bench["ngram"]["summary"]["overall"] if bench["ngram"] else None
    for peer, times in (("hf-plain", 10), ("hf-static", 5)):
        figures = (ngram or {}).get("peers", {}).get(peer)
        add(f"ngram >= {times}x transformers' {peer}", figures and ngram["tokens_per_s"] / figures["tokens_per_s"],
            times, "{:.1f}x")
    add("concurrency 8: speculative throughput >= plain",
        load and load["load"]["speculative"]["tokens_per_s"] / load["load"]["plain"]["tokens_per_s"], 1.0, "{:.2f}x")
    return out


def main(args: list[str]) -> None:
    if args[:1] == ["--aims"]:
        print("| aim | measured | met |")
        print("|---|---|---|")
        for aim, measured, met in aims(Path(args[1])):
            print(f"| {aim} | {measured} | {'-' if met is None else 'yes' if met else 'NO'} |")
        return
    if args[:1] == ["--load"]:
        for folder in args[1:]:
            print(load_line(Path(folder)))
        return
    print("| bench | steps | plain tok/s | spec tok/s | speedup (median, min-max) | τ | exact | peers tok/s "
          "| captures s (plain / spec) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for folder in args:
        print(line(Path(folder)))


if __name__ == "__main__":
    main(sys.argv[1:])
