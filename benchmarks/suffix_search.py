"""The suffix proposer's search time a step, hot: what a GPU host spends on it between a
verdict's read and the next replay.

    python benchmarks/suffix_search.py [--model smollm2-135m] [--per-category 1] [--tokens 64]
                                       [--repeats 3]

Runs the shipped recipe's proposer (suffix, γ 4) on the dev prompts (`--per-category` of each
category) once, recording every call the decode loop makes to it (prefill, propose, release),
then replays those calls on a fresh proposer `--repeats` times, timing each propose alone. No
forward runs between them, so the proposer's code and data stay in the CPU's caches, as they do
on a GPU host waiting on its device (on the CPU the same call takes several times longer between
two forwards, which evict them). Two workloads: the prompts served once (a fresh global tree),
and served twice, the second pass timed (every answer in the global tree once: a repeated
workload's long matches). Prints the median and mean µs a propose for each, and a digest of the
drafts, the same for any two versions of the search that draft the same.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import statistics
import time

from specpipe.config import compose
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.proposers.suffix import build


def record(pipe: Pipeline, prompts: list, tokens: int) -> list[tuple]:
    """Every call the decode loop makes to the proposer, with the rows' tokens as they were."""
    proposer, calls = pipe.proposer, []
    propose, prefill, release = proposer.propose, proposer.prefill, proposer.release

    def on_propose(rows, gammas):
        calls.append(("propose", dataclasses.replace(rows, tokens=copy.deepcopy(rows.tokens)), list(gammas)))
        return propose(rows, gammas)

    def on_prefill(row, prompt, out=None):
        calls.append(("prefill", row, list(prompt)))
        return prefill(row, prompt, out)

    def on_release(row, done):
        calls.append(("release", row, list(done)))
        return release(row, done)

    proposer.propose, proposer.prefill, proposer.release = on_propose, on_prefill, on_release
    for prompt in prompts:
        pipe.run(prompt, max_new_tokens=tokens)
    return calls


def replay(calls: list[tuple], proposer) -> tuple[list[float], str]:
    """-> (seconds of each propose, a digest of the drafts)."""
    seconds, digest = [], hashlib.md5()
    for kind, first, second in calls:
        if kind == "prefill":
            proposer.prefill(first, second)
        elif kind == "release":
            proposer.release(first, second)
        else:
            started = time.perf_counter()
            draft = proposer.propose(first, second)
            seconds.append(time.perf_counter() - started)
            digest.update(repr(draft).encode())
    return seconds, digest.hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pipe = Pipeline.from_config(compose([f"model={args.model}", "proposer=suffix", "gamma=4", "controller=fixed"]))
    by_category: dict[str, list] = {}
    for prompt in load_prompts("dev"):
        by_category.setdefault(prompt["category"], []).append(prompt["messages"])
    prompts = [m for group in by_category.values() for m in group[: args.per_category]]
    calls = record(pipe, prompts, args.tokens)
    steps = sum(kind == "propose" for kind, *_ in calls)
    print(f"{len(prompts)} prompts, {steps} proposes a pass, median of {args.repeats} replays")
    for label, passes in (("served once", 1), ("served twice, the second pass", 2)):
        medians, means = [], []
        for _ in range(args.repeats):
            proposer = build(context=None)
            for _ in range(passes - 1):
                replay(calls, proposer)  # fills the global tree; only the last pass is timed
            seconds, digest = replay(calls, proposer)
            medians.append(statistics.median(seconds))
            means.append(statistics.mean(seconds))
        print(f"{label}: propose median {statistics.median(medians) * 1e6:.1f} µs, "
              f"mean {statistics.median(means) * 1e6:.1f} µs (drafts {digest})")


if __name__ == "__main__":
    main()
