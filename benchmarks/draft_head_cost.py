"""Where a head's drafting time goes: ms per propose of a chain, and its torch profile.

Usage: python benchmarks/draft_head_cost.py [RECIPE ...] [KEY=VALUE ...] [--tokens=96] [--profile]
(RECIPE: a recipe yaml, default recipes/smollm2-135m/eagle3.yaml and eagle.yaml; KEY=VALUE:
overrides for every recipe, e.g. proposer.quantize=int8 gamma=2). Each recipe
runs the dev set's first code and chat prompts through its real pipeline (native engine,
greedy) after one warm-up; prints ms per propose and per verify step, ms per draft token
(propose time over tokens drafted), and the plain target's ms per token on the same prompts.
--profile adds the ops inside the propose calls by self CPU time (torch profiler; its own
overhead inflates that run's timings: take figures from a run without it).
Run alone on the machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict

import torch

from specpipe.config import compose
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts

PROPOSE = "specpipe.propose"


def timed_proposer(pipe, log: list[tuple[float, int]]):
    """Wrap the pipeline's proposer so each propose logs (seconds, tokens drafted: the draft's
    columns, a host int; one row here, a tree's nodes). The draft stays on the device: on a GPU
    the clock waits for the device before and after."""
    propose = pipe.proposer.propose
    device = pipe.runner.device

    def wrapped(rows, gammas):
        _sync(device)
        start = time.perf_counter()
        with torch.profiler.record_function(PROPOSE):
            draft = propose(rows, gammas)
        _sync(device)
        log.append((time.perf_counter() - start, draft.width))
        return draft

    pipe.proposer.propose = wrapped


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(recipe: str, overrides: list[str], options: dict) -> None:
    pipe = Pipeline.from_config(compose([f"recipe={recipe}", "engine=native", *overrides]))
    tokens = int(options.get("tokens", 96))
    prompts = [pipe.encode(p["messages"]) for c in ("code", "chat") for p in load_prompts("dev", [c])[:1]]
    pipe.run(prompts[0], max_new_tokens=16)  # kernel set-up: not measured
    log: list[tuple[float, int]] = []
    timed_proposer(pipe, log)
    plain, specs = [], []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if "profile" in options else None
    if profiler is not None:  # plain runs inside it too: only ops under a propose are counted
        profiler.start()
    for ids in prompts:
        base = pipe.run(ids, max_new_tokens=tokens, speculative=False)
        plain.append(base.stats.decode_s / base.stats.emitted)
        specs.append(pipe.run(ids, max_new_tokens=tokens).stats)
    if profiler is not None:
        profiler.stop()
    drafted, steps = sum(n for _, n in log), sum(s.steps for s in specs)
    print(f"{recipe} {' '.join(overrides)}: plain {1000 * statistics.mean(plain):.1f} ms/token; per step: propose "
          f"{1000 * sum(s.propose_s for s in specs) / steps:.2f} ms, verify "
          f"{1000 * sum(s.verify_s for s in specs) / steps:.2f} ms ({steps} steps, τ "
          f"{sum(s.emitted for s in specs) / steps:.2f}); "
          f"{1000 * sum(t for t, _ in log) / max(1, drafted):.2f} ms per draft token", flush=True)
    if profiler is not None:
        print_propose_ops(profiler, len(log), sum(t for t, _ in log))


def print_propose_ops(profiler, calls: int, seconds: float, rows: int = 25) -> None:
    """Self CPU time of the ops run inside propose calls, by op name, per propose call."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for event in profiler.events():
        parent = event.cpu_parent
        while parent is not None and parent.name != PROPOSE:
            parent = parent.cpu_parent
        if parent is not None:
            total[event.name] += event.self_cpu_time_total
            count[event.name] += 1
    ops = sum(us for name, us in total.items() if name != PROPOSE)
    print(f"ops inside propose, per call: {ops / calls:.0f} us of ops in {1e6 * seconds / calls:.0f} us "
          f"(the rest is Python); us self CPU and calls of each op per propose, {calls} proposes:")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:rows]:
        print(f"  {us / calls:8.1f} us  {count[name] / calls:6.1f}x  {name}")


def main(argv: list[str]) -> None:
    options = dict((a[2:].split("=", 1) + [""])[:2] for a in argv if a.startswith("--"))
    overrides = [a for a in argv if "=" in a and not a.startswith("--")]
    recipes = [a for a in argv if "=" not in a and not a.startswith("--")] or [
        "recipes/smollm2-135m/eagle3.yaml", "recipes/smollm2-135m/eagle.yaml"]
    for recipe in recipes:
        run(recipe, overrides, options)


if __name__ == "__main__":
    main(sys.argv[1:])
