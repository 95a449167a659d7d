"""Measure one pipeline over a prompt set: the plain target, the pipeline, and any peers,
interleaved per prompt, after a warm-up.

Per prompt the runs go in a rotated order (plain, speculative, peers; then speculative, peers,
plain; ...) so no configuration always runs first while the machine settles, and all runs of
a prompt see the same machine state. The plain run is the same loop with no proposer, so the
speedup compares two runs of the same code. Greedy outputs are compared token for token with
the plain target's; a divergence is recorded with the plain target's top-2 logit gap there.
It is not a summary (summary.py) and not a renderer (table.py, plots.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict

from specpipe.bench.peers import Peer
from specpipe.bench.records import Measured, PromptResult
from specpipe.exactness import first_divergence
from specpipe.pipeline import Pipeline

WARMUP_TOKENS = 32  # enough steps to see every block shape the controller picks early on


def warm_up(pipeline: Pipeline, ids: list[int], peers: list[Peer], count: int, seed: int) -> None:
    """First calls of each block shape pay kernel set-up: run them before anything is measured.
    What the controller learns from them is dropped (its state is put back as it was): steps
    that pay kernel set-up would tell the guard that speculation does not pay, and the first
    measured requests would wait for its next trial."""
    controller = copy.deepcopy(pipeline.controller)
    for _ in range(count):
        pipeline.run(ids, max_new_tokens=WARMUP_TOKENS, seed=seed, speculative=False)
        pipeline.run(ids, max_new_tokens=WARMUP_TOKENS, seed=seed)
        for peer in peers:
            peer.run(ids, WARMUP_TOKENS, seed)
    pipeline.controller = controller


def bench_prompts(
    pipeline: Pipeline,
    prompts: list[dict],
    *,
    max_new_tokens: int,
    seed: int = 0,
    stop: list[str] = (),
    peers: list[Peer] = (),
    on_result: Callable[[PromptResult], None] = lambda result: None,
    done: dict[int, PromptResult] | None = None,
) -> list[PromptResult]:
    """done: {prompt index: result} measured earlier (an interrupted run's), not measured again; each
    new result is added to it before `on_result` sees it, so a caller can keep them as they come."""
    results, done = [], {} if done is None else done
    for index, prompt in enumerate(prompts):
        if index in done:
            results.append(done[index])
            continue
        ids = pipeline.encode(prompt["messages"])
        tokens = min(int(prompt.get("max_new_tokens") or max_new_tokens), max_new_tokens)  # a prompt may ask fewer
        runs = _interleaved(pipeline, ids, peers, index, {"max_new_tokens": tokens, "seed": seed, "stop": list(stop)})
        result = done[index] = _compare(pipeline, prompt, ids, runs)
        on_result(result)
        results.append(result)
    return results


def _interleaved(pipeline: Pipeline, ids: list[int], peers: list[Peer], index: int, kwargs: dict) -> dict:
    jobs = {
        "baseline": lambda: Measured.of(pipeline.run(ids, speculative=False, **kwargs)),
        "speculative": lambda: Measured.of(pipeline.run(ids, **kwargs)),
        **{peer.name: (lambda p=peer: p.run(ids, kwargs["max_new_tokens"], kwargs["seed"])) for peer in peers},
    }
    names = list(jobs)
    shift = index % len(names)
    return {name: jobs[name]() for name in names[shift:] + names[:shift]}


def _compare(pipeline: Pipeline, prompt: dict, ids: list[int], runs: dict) -> PromptResult:
    baseline, speculative = runs.pop("baseline"), runs.pop("speculative")
    result = PromptResult(str(prompt.get("id", "")), str(prompt.get("category", "")), len(ids),
                          baseline, speculative, peers=runs)
    if not pipeline.sampling.greedy:
        return result  # sampled outputs differ by design; the distribution is tested statistically
    result.exact = speculative.token_ids == baseline.token_ids
    if not result.exact:
        div = first_divergence(pipeline.runner, ids, speculative.token_ids, baseline.token_ids)
        result.divergence = {**asdict(div), "near_tie": div.near_tie}
    result.peers_exact = {name: run.token_ids == baseline.token_ids for name, run in runs.items()}
    return result
