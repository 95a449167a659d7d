"""The two prompt splits of `specpipe tune`, and the rule that decides what it ships.

A tune that picks the best of ten candidates on a dozen prompts and quotes that best figure
overstates it: the pick is partly luck (the winner's curse). So the candidates are ranked on one
split (`choose_on=`, default `dev`; `prompts=` is its short form) and the chosen one is measured
again on another (`report_on=`, default `held-aside`), with no prompt in common, as a model tuner
tunes on a train split and reports on a validation split. On the report split tune measures the
chosen winner and the best of each simple family (ngram, suffix: proposers without a model, the
baselines anything with a model must beat), each ranked on the choose split.

The rule (`shipped`): a winner with a model (trained head, draft, twin) ships only where its
median on the report split beats the best of ngram and suffix there; else the better of those two
is written instead, and the recipe and the table say why. A simple winner ships as chosen. A
candidate whose greedy output diverged on the report split never ships. `report_on=none` skips
the report split (and the rule): the recipe then says it was not reported on other prompts.

Not here: measuring (tune.py benches each candidate like `specpipe bench`). Here: the table of
both splits that tune prints.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig, open_dict
from rich.table import Table

from specpipe.bench.summary import OVERALL, all_exact
from specpipe.commands import bench
from specpipe.errors import SpecpipeError
from specpipe.markup import esc

CHOOSE, REPORT = "choose_on", "report_on"
REPORT_ONLY = "spec-bench-"  # ids of the Spec-Bench set: reported on, never chosen on
SIMPLE = ("ngram", "suffix")  # model-free proposers: what a winner with a model must beat on the report split
NO_REPORT = ("", "none")


def has_report(cfg: DictConfig) -> bool:
    return str(cfg.report_on).strip().lower() not in NO_REPORT


def split_config(cfg: DictConfig, split: str) -> DictConfig:
    """The tune config with `prompts` (and `categories`) of one split: what its candidates carry.
    categories= picks among the choose split's categories; the report split keeps all of its own."""
    out = cfg.copy()
    with open_dict(out):
        out.prompts = str(cfg[split])
        if split == REPORT:
            out.categories = []
    return out


def select_splits(cfg: DictConfig) -> tuple[list[dict], list[dict]]:
    """(the choose split's prompts, the report split's: [] without one), refused before anything
    is measured if the two share a prompt (or if prompts= and choose_on= name two different sets:
    one is the other's short form, and one of them would be ignored)."""
    from specpipe.config import BenchConfig

    if cfg.prompts != BenchConfig.prompts and str(cfg.choose_on) != str(cfg.prompts):
        raise SpecpipeError(f"prompts={cfg.prompts} and choose_on={cfg.choose_on} name two different sets, but "
                            "prompts= is only choose_on='s short form: tune chooses on one set. Pass one of them "
                            "(and report_on= for the set it reports on). Nothing was measured.")
    choose = bench.select_prompts(split_config(cfg, CHOOSE))
    benchmark = [p["id"] for p in choose if str(p.get("id", "")).startswith(REPORT_ONLY)]
    if benchmark:
        raise SpecpipeError(
            f"choose_on={cfg.choose_on} holds {len(benchmark)} Spec-Bench prompts ({benchmark[0]}, ...): Spec-Bench "
            "is the benchmark the field reports on, and a strategy chosen on it would report a figure tuned to "
            "it. Choose on your own prompts (choose_on=dev, or a prompt file) and report on Spec-Bench with "
            "`specpipe bench prompts=spec-bench`. Nothing was measured.")
    if not has_report(cfg):
        return choose, []
    report = bench.select_prompts(split_config(cfg, REPORT))
    shared = [p["id"] for p in report if _text(p) in {_text(c) for c in choose}]
    if shared:
        named = ", ".join(shared[:3]) + (f" and {len(shared) - 3} more" if len(shared) > 3 else "")
        raise SpecpipeError(
            f"choose_on={cfg.choose_on} and report_on={cfg.report_on} share {len(shared)} of the "
            f"{len(report)} prompts tune would report on ({named}): a winner measured again on prompts it was "
            "chosen on says nothing about prompts it was not tuned on. Name two sets with no prompt in common "
            "(the defaults: choose_on=dev report_on=held-aside; prompts= is choose_on's short form), or "
            "report_on=none to skip the report split. Nothing was measured.")
    return choose, report


def _text(prompt: dict) -> str:
    """A prompt's identity for the overlap check: its messages (one prompt under two ids is one prompt)."""
    return json.dumps(prompt["messages"], sort_keys=True, ensure_ascii=False)


def is_simple(strategy: dict) -> bool:
    return strategy.get("proposer") in SIMPLE


def median(payload: dict) -> float:
    return payload["summary"][OVERALL]["speedup"]["median"]


def to_report(tried: dict, best: str | None) -> list[str]:
    """The candidates measured on the report split: the chosen winner and the best exact one of
    each simple family on the choose split, in that order."""
    names = [best] if best else []
    for family in SIMPLE:
        scored = {n: median(p) for n, (s, p) in tried.items()
                  if s.get("proposer") == family and all_exact(p["summary"][OVERALL])}
        if scored:
            names.append(max(scored, key=scored.get))
    return list(dict.fromkeys(names))


def shipped(tried: dict, best: str | None, reported: dict, report_on: str) -> tuple[str | None, str]:
    """(the candidate the recipe holds, None for plain decoding; why, in one sentence).
    `reported`: {name: results payload on the report split}."""
    if best is None:
        return None, "no exact candidate beat the plain target on the choose split, so speculation is off"
    if not reported:
        return best, f"the best on the choose split; not reported on other prompts (report_on={report_on or 'none'})"
    simple = {n: median(p) for n, p in reported.items()
              if n != best and is_simple(tried[n][0]) and all_exact(p["summary"][OVERALL])}
    rival = max(simple, key=simple.get, default=None)
    fallback = (rival, None) if rival else (None, "none of ngram and suffix was exact there either")
    if not all_exact(reported[best]["summary"][OVERALL]):
        who, note = fallback
        return who, f"{best} diverged from the plain target on report_on={report_on}" + (
            f"; {who}, the best of ngram and suffix there, is written instead" if who else f"; {note}")
    if is_simple(tried[best][0]):
        return best, f"the best on the choose split, a model-free strategy; {_x(reported[best])} on report_on={report_on}"
    if rival is None:
        return best, (f"{_x(reported[best])} on report_on={report_on}; no ngram or suffix candidate was tried to "
                      "compare it with (strategies= left them out)")
    if median(reported[best]) > simple[rival]:
        return best, f"beats {rival} on report_on={report_on}: {_x(reported[best])} against {simple[rival]:.2f}x"
    return rival, (f"{best} won the choose split but did not beat {rival} on report_on={report_on} "
                   f"({_x(reported[best])} against {simple[rival]:.2f}x): a model ships only where it beats "
                   "the best of ngram and suffix on prompts it was not chosen on")


def _x(payload: dict) -> str:
    return f"{median(payload):.2f}x"


def split_figures(cfg: DictConfig, split: str, prompts: list[dict], results: dict) -> dict:
    """A recipe's record of one split: the set, how it was cut, and each candidate measured on it
    with its median speedup, spread over prompts and exactness."""
    return {"set": str(cfg[split]), "categories": list(cfg.categories) if split == CHOOSE else [],
            "limit": cfg.limit, "prompts": len(prompts),
            "speedup": {name: spread(p) for name, p in results.items()}}


def spread(payload: dict) -> dict:
    overall = payload["summary"][OVERALL]
    figures = {k: round(overall["speedup"][k], 3) for k in ("median", "min", "p25", "p75", "max")}
    return {**figures, "exact": all_exact(overall)}


def table(cfg: DictConfig, tried: dict, reported: dict, ship: tuple[str | None, str]) -> Table:
    """Every candidate on the choose split, and on the report split those measured there; the
    caption says what ships and why."""
    name, why = ship
    sets = f"chosen on {cfg.choose_on}" + (f", reported on {cfg.report_on}" if reported else "")
    shown = Table(title=esc(f"specpipe tune: {cfg.model.name}, {sets}"), caption=(
        "speedup: median (min-max) over prompts against the plain target, same run; acceptance and τ on the "
        f"choose split; exact: per split. ★ shipped, {esc(name or 'plain decoding')}: {esc(why)}"))
    columns = ["candidate", "chosen on", *(["reported on"] if reported else []), "acceptance", "τ", "exact"]
    for column in columns:
        shown.add_column(column, justify="left" if column == "candidate" else "right")
    for candidate, (_, payload) in tried.items():
        overall, again = payload["summary"][OVERALL], reported.get(candidate)
        exact = [_exactness(overall)] + ([_exactness(again["summary"][OVERALL])] if again else [])
        report = [_speedup(again) if again else "–"] if reported else []
        shown.add_row(("★ " if candidate == name else "  ") + esc(candidate), _speedup(payload), *report,
                      f"{overall['acceptance_rate']:.2f}", f"{overall['mean_accepted_length']:.2f}", " | ".join(exact))
    return shown


def _speedup(payload: dict) -> str:
    speedup = payload["summary"][OVERALL]["speedup"]
    return f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f})"


def _exactness(overall: dict) -> str:
    exactness = overall["exactness"]
    return "n/a" if exactness is None else f"{exactness['identical']}/{exactness['of']}"
