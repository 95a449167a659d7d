"""A bench run over the built-in `spec-bench` prompts, in the layout of Spec-Bench's leaderboard
(hemingkx/Spec-Bench): speedup per category, τ and the overall speedup, a column per category.

The figures follow Spec-Bench's own evaluation/speed.py so they can sit beside the field's
numbers: a category's speedup is the mean tokens/s of the pipeline over its prompts ÷ the mean
tokens/s of the plain target over the same prompts (the main bench table's is the median of
per-prompt ratios), and τ (its "#Mean Accepted Tokens") pools the steps, tokens emitted ÷ steps.
Only Spec-Bench's six categories are grouped: prompts of another set joined in
(`prompts=dev+spec-bench`) stay out of it. A report, never a basis for choosing or tuning.
"""

from __future__ import annotations

import statistics

from rich.table import Table

from specpipe.bench.summary import OVERALL
from specpipe.markup import esc

# Spec-Bench's category names in the prompt file, and its leaderboard's column heads, in its order
CATEGORIES = {"mt_bench": "Multi-turn Conversation", "translation": "Translation",
              "summarization": "Summarization", "qa": "Question Answering",
              "math_reasoning": "Mathematical Reasoning", "rag": "Retrieval-aug. Generation"}
SET_NAME = "spec-bench"


def is_spec_bench(prompts: str) -> bool:
    """Whether a bench's `prompts=` names the built-in set, alone or joined with `+`."""
    return SET_NAME in (part.strip() for part in str(prompts).split("+"))


def spec_bench_figures(prompts: list[dict]) -> dict[str, dict]:
    """{category: {"prompts", "speedup", "tau", "peers": {name: speedup}}, ..., "overall": ...}
    from a bench's per-prompt results (results.json's "prompts"), in Spec-Bench's order; a
    category without prompts is absent, and so is "overall" when none is Spec-Bench's."""
    groups = {c: [p for p in prompts if p["category"] == c] for c in CATEGORIES}
    groups = {c: group for c, group in groups.items() if group}
    if groups:
        groups[OVERALL] = [p for group in groups.values() for p in group]
    return {c: _figures(group) for c, group in groups.items()}


def _figures(prompts: list[dict]) -> dict:
    plain = statistics.mean(p["baseline"]["tokens_per_s"] for p in prompts)
    stats = [p["speculative"]["stats"] for p in prompts]
    steps = sum(s["steps"] for s in stats)
    peers = dict.fromkeys(name for p in prompts for name in p["peers"])
    return {"prompts": len(prompts),
            "speedup": statistics.mean(p["speculative"]["tokens_per_s"] for p in prompts) / plain,
            "tau": sum(s["new_tokens"] for s in stats) / steps if steps else 0.0,
            "peers": {name: statistics.mean(p["peers"][name]["tokens_per_s"] for p in prompts) / plain
                      for name in peers}}


def spec_bench_table(payload: dict) -> Table:
    """The strategy's row as the leaderboard prints one (and its τ per category beneath it, and a
    row per peer); "-" where the run had no prompt of a category (`categories=`)."""
    figures = spec_bench_figures(payload["prompts"])
    proposer = esc(payload["strategy"]["proposer"])
    table = Table(title=f"Spec-Bench layout: {esc(payload['model'])} · proposer {proposer}",
                  caption="speedup: mean tok/s ÷ the plain target's mean tok/s over a category's prompts, same run "
                          "(Spec-Bench's evaluation/speed.py); τ: tokens emitted per step")
    columns = (*CATEGORIES, OVERALL)
    count = {c: figures.get(c, {}).get("prompts", 0) for c in columns}  # in the heads: a sample shows its size
    table.add_column("run")
    for category, head in CATEGORIES.items():
        table.add_column(f"{head} ({count[category]})", justify="right")
    table.add_column("#Mean Accepted Tokens", justify="right")
    table.add_column(f"Overall ({count[OVERALL]})", justify="right")
    speedups = [_speedup(figures.get(c, {}).get("speedup")) for c in columns]
    taus = [_tau(figures.get(c, {}).get("tau")) for c in columns]
    table.add_row(f"{proposer} speedup", *speedups[:-1], taus[-1], speedups[-1], style="bold")
    table.add_row("  τ", *taus[:-1], "", taus[-1], style="dim")
    for name in figures.get(OVERALL, {}).get("peers", {}):
        cells = [_speedup(figures.get(c, {}).get("peers", {}).get(name)) for c in columns]
        table.add_row(f"  ↳ {esc(name)}", *cells[:-1], "", cells[-1], style="dim")
    return table


def _speedup(value: float | None) -> str:
    if value is None:
        return "-"
    color = "green" if value >= 1.0 else "red"
    return f"[{color}]{value:.2f}x[/{color}]"


def _tau(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
