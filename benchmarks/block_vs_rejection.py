"""Block verification against rejection sampling: the same target, drafter, prompts and seeds.

    python benchmarks/block_vs_rejection.py                      # the int8 twin, then the EAGLE-3 head
    python benchmarks/block_vs_rejection.py --drafters eagle3 --limit 2 --seeds 3 --tokens 128

Per drafter and temperature the target and the drafter load once and both verifiers run on them (one
pipeline, the verifier swapped), with a fixed γ and the guard off, so every step drafts γ tokens
from a distribution and only the acceptance rule differs. Per prompt and seed: the plain target
(the tokens/s baseline), then rejection sampling and block verification, in an order that
alternates with the seed (the machine's drift falls on both). Both verifiers draw their uniforms
and next tokens from the same seeded streams. Printed per temperature and verifier: τ (emitted
tokens per step, pooled over every step, with its standard error), the acceptance rate, decode
tokens/s and the speedup over the plain target (medians over the runs). Sampled outputs differ
between the verifiers by design; both are distributed as the target's (tests/test_block_verify.py).
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from specpipe.config import compose
from specpipe.metrics import Stats
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.verifiers.block import BlockVerifier

REPO = Path(__file__).resolve().parents[1]
DRAFTERS = {
    "twin": ["proposer=twin"],  # the target's int8 copy: a draft model with probabilities
    # the shipped EAGLE-3 head alone: its recipe's lookup drafts one-hot, mixing in drafts without probabilities
    "eagle3": [f"recipe={REPO / 'recipes/smollm2-135m/eagle3.yaml'}", "proposer.lookup=false"],
}
VERIFIERS = ("rejection", "block")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafters", nargs="+", choices=DRAFTERS, default=list(DRAFTERS))
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--prompts", default="dev")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per prompt")
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    prompts = _prompts(args.prompts, args.limit)
    load = os.getloadavg()[0]  # tokens/s mean little on a busy machine: the table says how busy it was
    rows = []
    for drafter in args.drafters:
        for temperature in args.temperatures:
            runs = _measure(args, drafter, temperature, prompts)
            rows += [(drafter, temperature, name, runs[name]) for name in VERIFIERS]
            _table(args, prompts, rows, (load, os.getloadavg()[0]))  # so far: a cut-short run keeps its rows


def _measure(args, drafter: str, temperature: float, prompts: list[dict]) -> dict[str, list]:
    """verifier name -> [(stats, speedup over the plain run of the same prompt and seed)]."""
    pipes = _pipelines(args.model, drafter, args.gamma, temperature)
    warm = pipes["rejection"].encode(prompts[0]["messages"])
    for pipe in pipes.values():  # the first calls of each block shape pay kernel set-up: not measured
        pipe.run(warm, max_new_tokens=16, seed=99)
    runs = {name: [] for name in VERIFIERS}
    for prompt in prompts:
        ids = pipes["rejection"].encode(prompt["messages"])
        for seed in range(args.seeds):
            plain = pipes["rejection"].run(ids, max_new_tokens=args.tokens, seed=seed, speculative=False)
            for name in VERIFIERS if seed % 2 == 0 else VERIFIERS[::-1]:
                gen = pipes[name].run(ids, max_new_tokens=args.tokens, seed=seed)
                speedup = gen.stats.tokens_per_s / plain.stats.tokens_per_s
                runs[name].append((gen.stats, speedup))
                print(f"{drafter} T={temperature} {prompt['id']:14s} seed {seed} {name:9s} "
                      f"τ={gen.stats.mean_accepted_length:.2f} {gen.stats.tokens_per_s:.1f} tok/s x{speedup:.2f}",
                      flush=True)
    return runs


def _prompts(name: str, limit: int) -> list[dict]:
    """The first `limit` prompts of each category, in the set's order."""
    chosen, seen = [], {}
    for prompt in load_prompts(name):
        seen[prompt["category"]] = seen.get(prompt["category"], 0) + 1
        if seen[prompt["category"]] <= limit:
            chosen.append(prompt)
    return chosen


def _pipelines(model: str, drafter: str, gamma: int, temperature: float) -> dict[str, Pipeline]:
    """verifier=rejection from the config, and the same pipeline with block verification."""
    overrides = [f"model={model}", *DRAFTERS[drafter], "verifier=rejection", f"temperature={temperature}",
                 "controller=fixed", f"gamma={gamma}", "guard=false"]
    first = Pipeline.from_config(compose(overrides))
    block = Pipeline(first.target, first.proposer, BlockVerifier(first.sampling), first.controller, first.sampling,
                     first.chat, runner=first.runner)
    return {"rejection": first, "block": block}


def _pooled(stats: list[Stats]) -> tuple[float, float]:
    """τ over every step of the runs, and its standard error."""
    emitted = [n for s in stats for n in s.emitted_trace]
    return statistics.mean(emitted), statistics.stdev(emitted) / len(emitted) ** 0.5


def _table(args, prompts: list[dict], rows, load: tuple[float, float]) -> None:
    print(f"\n{args.model}, γ={args.gamma} fixed, guard off, {len(prompts)} {args.prompts} prompts "
          f"(the first of each category) x {args.seeds} seeds, {args.tokens} new tokens; load average "
          f"{load[0]:.1f} at the start, {load[1]:.1f} at the end ({os.cpu_count()} CPUs)")
    print("| drafter | temperature | verifier | τ (± s.e.) | acceptance | tokens/s (median) | speedup (median) "
          "| steps |")
    print("|---|---|---|---|---|---|---|---|")
    for drafter, temperature, name, runs in rows:
        stats = [s for s, _ in runs]
        tau, error = _pooled(stats)
        accepted, drafted = sum(s.accepted for s in stats), sum(s.drafted for s in stats)
        print(f"| {drafter} | {temperature} | {name} | {tau:.2f} ± {error:.2f} | {accepted / drafted:.3f} "
              f"| {statistics.median(s.tokens_per_s for s in stats):.1f} "
              f"| {statistics.median(x for _, x in runs):.2f}x | {sum(s.steps for s in stats)} |")


if __name__ == "__main__":
    main()
