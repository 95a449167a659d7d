"""Where a head's drafting time goes: ms per propose of a chain, and its torch profile.

Usage: python benchmarks/draft_head_cost.py [RECIPE ...] [--gamma=4] [--tokens=96] [--profile]
(RECIPE: a recipe yaml, default recipes/smollm2-135m/eagle3.yaml and eagle.yaml). Each recipe
runs the dev set's first code and chat prompts through its real pipeline (native engine,
greedy) after one warm-up; prints ms per propose and per verify step, ms per draft token
(propose time over tokens drafted), and the plain target's ms per token on the same prompts.
--profile adds the top ops of the propose calls by self CPU time (torch profiler).
Run alone on the machine.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specpipe.build import build_pipeline
from specpipe.config import compose
from specpipe.prompts import load_prompts


def timed_proposer(pipe, log: list[tuple[float, int]]):
    """Wrap the pipeline's proposer so each propose logs (seconds, tokens drafted)."""
    propose = pipe.proposer.propose

    def wrapped(state, gamma):
        start = time.perf_counter()
        draft = propose(state, gamma)
        log.append((time.perf_counter() - start, len(draft.tokens)))
        return draft

    pipe.proposer.propose = wrapped


def run(recipe: str, options: dict) -> None:
    pipe = build_pipeline(compose([f"recipe={recipe}", "engine=native", f"gamma={options.get('gamma', 4)}"]))
    tokens = int(options.get("tokens", 96))
    prompts = [pipe.encode(p["messages"]) for c in ("code", "chat") for p in load_prompts("dev", [c])[:1]]
    pipe.run(prompts[0], max_new_tokens=16)  # kernel set-up: not measured
    log: list[tuple[float, int]] = []
    timed_proposer(pipe, log)
    plain, specs = [], []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if "profile" in options else None
    for ids in prompts:
        base = pipe.run(ids, max_new_tokens=tokens, speculative=False)
        plain.append(base.stats.decode_s / base.stats.emitted)
        if profiler is not None:
            profiler.start()
        spec = pipe.run(ids, max_new_tokens=tokens)
        if profiler is not None:
            profiler.stop()
        specs.append(spec.stats)
    drafted, steps = sum(n for _, n in log), sum(s.steps for s in specs)
    print(f"{recipe}: plain {1000 * statistics.mean(plain):.1f} ms/token; per step: propose "
          f"{1000 * sum(s.propose_s for s in specs) / steps:.2f} ms, verify "
          f"{1000 * sum(s.verify_s for s in specs) / steps:.2f} ms ({steps} steps, τ "
          f"{sum(s.emitted for s in specs) / steps:.2f}); "
          f"{1000 * sum(t for t, _ in log) / max(1, drafted):.2f} ms per draft token", flush=True)
    if profiler is not None:
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main(argv: list[str]) -> None:
    options = dict((a[2:].split("=", 1) + [""])[:2] for a in argv if a.startswith("--"))
    recipes = [a for a in argv if not a.startswith("--")] or ["recipes/smollm2-135m/eagle3.yaml",
                                                              "recipes/smollm2-135m/eagle.yaml"]
    torch.set_num_threads(int(options.get("threads", torch.get_num_threads())))
    for recipe in recipes:
        run(recipe, options)


if __name__ == "__main__":
    main(sys.argv[1:])
