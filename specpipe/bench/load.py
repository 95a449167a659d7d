"""Request load (`specpipe bench requests=N concurrency=C`): a stream of N requests through
continuous batching, C at a time, plain and speculative in the same run.

The stream is drawn from the prompt set: passes over the set, each pass in a shuffled order
(seeded), so every prompt type is served about equally often and a request's neighbours in the
batch vary. A closed loop, as a client holding C connections open: a request is sent when a slot
frees, so its latency counts from then (its prefill included) to its last token. The plain run
is the same loop with no proposer (specpipe/decode/loop.py), on the same stream.

Figures, per mode: throughput (output tokens/s and requests/s over the wall time of the whole
stream), and per request P50/P90/P99 of latency, time to first token (TTFT) and time per output
token after the first (TPOT, vLLM's definition). Speculative only: acceptance rate and τ per
category with their spread across requests, and γ over time (one point per batch step). Greedy:
each request's output is compared with the plain run's.

`summary` (the same keys as a per-prompt run, so `specpipe report` tables a sweep of both): the
overall entry holds the system throughputs and their ratio; a category entry the mean tokens/s
its requests saw and the spread of their per-request speedups.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from specpipe.decode.loop import Decoder, Request
from specpipe.bench.summary import OVERALL, _pooled_positions, _quantile, gamma_summary, spread
from specpipe.pipeline import Pipeline


@dataclass
class Served:
    """One request of the stream as one mode served it."""

    id: str
    category: str
    token_ids: list[int]
    latency_s: float
    ttft_s: float
    tpot_s: float | None  # None: a single output token
    stats: dict  # Stats.to_dict(): tokens/s the request saw, acceptance, τ


def request_stream(prompts: list[dict], count: int, seed: int) -> list[dict]:
    """`count` prompts: whole passes over the set, each shuffled (seeded)."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        order = list(prompts)
        rng.shuffle(order)
        out.extend(order)
    return out[:count]


def serve(pipeline: Pipeline, stream: list[dict], ids: list[list[int]], *, concurrency: int, speculative: bool,
          max_new_tokens: int, seed: int, stop: list[str]) -> tuple[list[Served], Decoder, float]:
    """Decode the stream; (each request's outcome, the decoder (its step trace), wall seconds)."""
    decoder = Decoder(pipeline, concurrency, speculative, seed)  # the run's stream: the requests carry no seed
    requests = [Request(i, min(int(p.get("max_new_tokens") or max_new_tokens), max_new_tokens), None, tuple(stop))
                for p, i in zip(stream, ids)]
    tokens: list[list[int]] = [[] for _ in requests]
    served: dict[int, Served] = {}
    started = time.perf_counter()
    for event in decoder.run(requests):
        tokens[event.index].extend(event.tokens)
        if event.finish_reason is None:
            continue
        t, n = event.timing, len(tokens[event.index])
        prompt = stream[event.index]
        served[event.index] = Served(str(prompt.get("id", "")), str(prompt.get("category", "")), tokens[event.index],
                                     t.latency_s, t.ttft_s, (t.finished_s - t.first_token_s) / (n - 1) if n > 1 else None,
                                     event.stats.to_dict())
    return [served[i] for i in range(len(requests))], decoder, time.perf_counter() - started


def measure_load(pipeline: Pipeline, prompts: list[dict], *, requests: int, concurrency: int, max_new_tokens: int,
                 seed: int = 0, stop: list[str] = (), peers: dict | None = None) -> dict:
    """The `load` section of results.json (see the module docstring); peers: name -> a callable
    (stream ids, max_new_tokens) -> (token ids per request, wall seconds), e.g. hf-batched."""
    stream = request_stream(prompts, requests, seed)
    ids = [pipeline.encode(p["messages"]) for p in stream]
    options = dict(concurrency=concurrency, max_new_tokens=max_new_tokens, seed=seed, stop=list(stop))
    plain, _, plain_s = serve(pipeline, stream, ids, speculative=False, **options)
    spec, decoder, spec_s = serve(pipeline, stream, ids, speculative=True, **options)
    load = {
        "requests": requests, "concurrency": concurrency, "slots": decoder.slots, "batch_refusal": decoder.refusal,
        "plain": _mode_figures(plain, plain_s), "speculative": _mode_figures(spec, spec_s),
        "by_category": _by_category(spec, plain, pipeline.sampling.greedy),
        "gamma_over_time": [[round(s.at_s, 4), s.batch, s.gamma] for s in decoder.steps],
        "exact": _exactness(spec, plain) if pipeline.sampling.greedy else None,
        "memory_bytes": decoder.memory(),
        "peers": {},
    }
    load["speedup"] = load["speculative"]["tokens_per_s"] / load["plain"]["tokens_per_s"]
    for name, run in (peers or {}).items():
        outputs, wall = run(ids, max_new_tokens)
        produced = sum(len(o) for o in outputs)
        load["peers"][name] = {"tokens_per_s": produced / wall, "requests_per_s": len(outputs) / wall,
                               "speedup": (produced / wall) / load["plain"]["tokens_per_s"],
                               "exact": _exactness_ids(outputs, plain) if pipeline.sampling.greedy else None}
    return load


def load_summary(load: dict) -> dict:
    """The per-category and overall `summary` of a load run, in the per-prompt run's keys."""
    out = {category: _category_summary(figures) for category, figures in load["by_category"].items()}
    steps = [g for _, _, g in load["gamma_over_time"]]
    out[OVERALL] = {
        "prompts": load["requests"],
        "baseline_tokens_per_s": load["plain"]["tokens_per_s"],
        "tokens_per_s": load["speculative"]["tokens_per_s"],
        "speedup": spread([load["speedup"]]),
        "acceptance_rate": load["speculative"]["acceptance_rate"],
        "mean_accepted_length": load["speculative"]["mean_accepted_length"],
        "per_position_acceptance": load["speculative"]["per_position_acceptance"],
        "gamma": gamma_summary(steps),
        "guard": {"held": load["speculative"].get("guard_held", 0), "steps": len(steps)},
        "time_per_token_ms": {"baseline": _p50_p99(load["plain"]["tpot_ms"]),
                              "speculative": _p50_p99(load["speculative"]["tpot_ms"])},
        "exactness": load["exact"],
        "peers": {name: {"tokens_per_s": p["tokens_per_s"], "speedup": spread([p["speedup"]]),
                         "exactness": p["exact"]} for name, p in load["peers"].items()},
    }
    return out


def _mode_figures(served: list[Served], wall_s: float) -> dict:
    tokens = sum(len(s.token_ids) for s in served)
    drafted = sum(s.stats["drafted"] for s in served)
    accepted = sum(s.stats["accepted"] for s in served)
    steps = sum(s.stats["steps"] for s in served)
    return {
        "wall_s": wall_s, "output_tokens": tokens,
        "tokens_per_s": tokens / wall_s, "requests_per_s": len(served) / wall_s,
        "latency_ms": _percentiles([s.latency_s for s in served]),
        "ttft_ms": _percentiles([s.ttft_s for s in served]),
        "tpot_ms": _percentiles([s.tpot_s for s in served if s.tpot_s is not None]),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": tokens / steps if steps else 0.0,
        "per_position_acceptance": _pooled_positions([s.stats for s in served]),
        "guard_held": sum(s.stats.get("guard_held", 0) for s in served),  # row steps the guard held at γ = 0
        "row_steps": steps,
    }


def _by_category(spec: list[Served], plain: list[Served], greedy: bool) -> dict:
    out: dict[str, dict] = {}
    for category in dict.fromkeys(s.category for s in spec):
        pairs = [(s, p) for s, p in zip(spec, plain) if s.category == category]
        out[category] = {
            "requests": len(pairs),
            "acceptance_rate": spread([s.stats["acceptance_rate"] for s, _ in pairs]),
            "mean_accepted_length": spread([s.stats["mean_accepted_length"] for s, _ in pairs]),
            "tokens_per_s": statistics.mean(s.stats["tokens_per_s"] for s, _ in pairs),
            "baseline_tokens_per_s": statistics.mean(p.stats["tokens_per_s"] for _, p in pairs),
            "speedup": spread([s.stats["tokens_per_s"] / p.stats["tokens_per_s"] for s, p in pairs]),
            "tpot_ms": {"plain": _percentiles([p.tpot_s for _, p in pairs if p.tpot_s is not None]),
                        "speculative": _percentiles([s.tpot_s for s, _ in pairs if s.tpot_s is not None])},
            "exact": _exactness([s for s, _ in pairs], [p for _, p in pairs]) if greedy else None,
        }
    return out


def _category_summary(figures: dict) -> dict:
    return {
        "prompts": figures["requests"],
        "baseline_tokens_per_s": figures["baseline_tokens_per_s"],
        "tokens_per_s": figures["tokens_per_s"],
        "speedup": figures["speedup"],
        "acceptance_rate": figures["acceptance_rate"]["median"],
        "mean_accepted_length": figures["mean_accepted_length"]["median"],
        "per_position_acceptance": [],
        "gamma": gamma_summary([]),
        "time_per_token_ms": {"baseline": _p50_p99(figures["tpot_ms"]["plain"]),
                              "speculative": _p50_p99(figures["tpot_ms"]["speculative"])},
        "exactness": figures["exact"],
        "peers": {},
    }


def _percentiles(seconds: list[float]) -> dict | None:
    if not seconds:
        return None
    ms = sorted(s * 1000 for s in seconds)
    return {"p50": _quantile(ms, 0.50), "p90": _quantile(ms, 0.90), "p99": _quantile(ms, 0.99),
            "mean": statistics.mean(ms)}


def _p50_p99(figures: dict | None) -> dict | None:
    return None if figures is None else {"p50": figures["p50"], "p99": figures["p99"]}


def _exactness(spec: list[Served], plain: list[Served]) -> dict:
    return _exactness_ids([s.token_ids for s in spec], plain, [s.id for s in spec])


def _exactness_ids(outputs: list[list[int]], plain: list[Served], ids: list[str] | None = None) -> dict:
    failures = [ids[i] if ids else str(i) for i, (o, p) in enumerate(zip(outputs, plain)) if o != p.token_ids]
    return {"identical": len(outputs) - len(failures), "of": len(outputs),
            "share": (len(outputs) - len(failures)) / len(outputs) if outputs else 1.0,
            "failures": failures, "near_ties": []}
