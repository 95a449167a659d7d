"""Per-category and overall figures from the per-prompt results of one bench run.

speedup: per prompt, tokens/s of the pipeline ÷ tokens/s of the plain target on that prompt
(the same run, interleaved), then the median and spread over prompts. Acceptance rate,
τ and per-position acceptance pool the steps of all prompts. Time per token: each emitted token
gets its step's time shared by the tokens that step emitted; P50 / P99 over all tokens.
Exactness (greedy): the share of prompts whose output is token-identical to the plain target's;
anything under 100% is a failure (near-ties are named, not excused). worst: the prompt with the
lowest speedup (what a user of that category can lose). guard: the steps the guard held at γ = 0
(speculation paused, or a plain probe) out of all steps.
"""

from __future__ import annotations

import statistics
from collections import Counter

from specpipe.bench.records import PromptResult

OVERALL = "overall"


def summarize(results: list[PromptResult]) -> dict[str, dict]:
    """{category: figures, ..., "overall": figures}, categories in the order they first appear."""
    categories = list(dict.fromkeys(r.category for r in results))
    out = {c: category_figures([r for r in results if r.category == c]) for c in categories}
    out[OVERALL] = category_figures(results)
    return out


def category_figures(results: list[PromptResult]) -> dict:
    stats = [r.speculative.stats for r in results]
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    steps, emitted = sum(s["steps"] for s in stats), sum(s["new_tokens"] for s in stats)
    return {
        "prompts": len(results),
        "baseline_tokens_per_s": statistics.mean(r.baseline.tokens_per_s for r in results),
        "tokens_per_s": statistics.mean(r.speculative.tokens_per_s for r in results),
        "speedup": spread([r.speedup for r in results]),
        "worst": worst_prompt(results),
        "guard": {"held": sum(s.get("guard_held", 0) for s in stats), "steps": steps},
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": emitted / steps if steps else 0.0,
        "per_position_acceptance": _pooled_positions(stats),
        "gamma": gamma_summary([g for s in stats for g in s["gamma_trace"]]),
        "time_per_token_ms": {
            "baseline": _percentiles([t for r in results for t in r.baseline.time_per_token_s]),
            "speculative": _percentiles([t for r in results for t in r.speculative.time_per_token_s]),
        },
        "exactness": _exactness(results, lambda r: r.exact, near_ties=True),
        "peers": _peer_figures(results),
    }


def worst_prompt(results: list[PromptResult]) -> dict:
    worst = min(results, key=lambda r: r.speedup)
    return {"id": worst.id, "speedup": worst.speedup}


def all_exact(figures: dict) -> bool:
    """Every greedy output token-identical to the plain target's (sampling: nothing to compare)."""
    return figures["exactness"] is None or figures["exactness"]["share"] == 1.0


def spread(values: list[float]) -> dict:
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "p25": quartiles[0], "p75": quartiles[2]}


def gamma_summary(trace: list[int]) -> dict:
    if not trace:
        return {"mean": 0.0, "min": 0, "max": 0, "off_share": 1.0, "histogram": {}}
    return {"mean": statistics.mean(trace), "min": min(trace), "max": max(trace),
            "off_share": sum(g == 0 for g in trace) / len(trace),  # steps without a draft
            "histogram": {str(g): n for g, n in sorted(Counter(trace).items())}}


def _pooled_positions(stats: list[dict]) -> list[float]:
    drafted, accepted = Counter(), Counter()
    for s in stats:
        for i, (a, d) in enumerate(zip(s["accepted_at"], s["drafted_at"])):
            drafted[i] += d
            accepted[i] += a
    return [accepted[i] / drafted[i] for i in sorted(drafted) if drafted[i]]


def _percentiles(seconds: list[float]) -> dict | None:
    if not seconds:
        return None
    ms = sorted(s * 1000 for s in seconds)
    return {"p50": _quantile(ms, 0.50), "p99": _quantile(ms, 0.99)}


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _exactness(results: list[PromptResult], exact_of, near_ties: bool = False) -> dict | None:
    flags = [(r, exact_of(r)) for r in results]
    if any(flag is None for _, flag in flags):
        return None  # sampling: outputs differ by design
    failures = [r.id for r, flag in flags if not flag]
    return {"identical": len(flags) - len(failures), "of": len(flags),
            "share": (len(flags) - len(failures)) / len(flags), "failures": failures,
            "near_ties": [r.id for r in results if near_ties and r.divergence and r.divergence["near_tie"]]}


def _peer_figures(results: list[PromptResult]) -> dict:
    names = list(dict.fromkeys(n for r in results for n in r.peers))
    return {
        name: {
            "tokens_per_s": statistics.mean(r.peers[name].tokens_per_s for r in results),
            "speedup": spread([r.peers[name].tokens_per_s / r.baseline.tokens_per_s for r in results]),
            "exactness": _exactness(results, lambda r, n=name: r.peers_exact.get(n)),
        }
        for name in names
    }
