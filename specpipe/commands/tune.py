"""`specpipe tune model=... choose_on=dev report_on=held-aside`: try the sensible strategies for one
target, choose on one prompt split, report on another, keep what holds up.

Candidates come from strategies/ (all, or `strategies=[...]`), and from the recipes of trained
heads already in the destination folder (`specpipe train` writes them there): every strategy with the fixed controller once per γ in
`gammas`, adaptive ones once. A draft-model strategy needs a draft: `draft=NAME|PATH`, or a
smaller zoo model with the target's tokenizer; without one it is skipped (and so is any
candidate whose compatibility checks refuse it, with the reason printed). Each candidate is
benched like `specpipe bench` (interleaved with the plain target, same prompts) and its
results.json kept under `work=`, so an interrupted tune resumes where it stopped: a candidate's
earlier results are reused only if measured with the same settings (results.py `measured_with`),
else it is measured again and says what changed. The two splits are checked disjoint, and `out=`
and `work=` writable, before anything is measured (tune_split.py, specpipe/outputs.py).

The winner is chosen on `choose_on=` (`prompts=` for short): the candidate with the best overall
median speedup among those whose greedy outputs were all token-identical to the plain target's;
if none beats the plain target, the recipe says so (proposer none). It is then measured on
`report_on=` beside the best ngram and suffix candidates, and a winner with a model ships only
if it beats both there (tune_split.py `shipped`). With `batch_sizes=[4,8]` the shipped strategy is then served as a request
load (bench/load.py) at each of those concurrencies once per γ in `gammas`: the best γ there
(0 where none beats plain batched decoding) goes into the recipe as its `batch_schedule`. It is written atomically to `recipes/<model>/specpipe.yaml`
(`out=DIR`: DIR/<model>/specpipe.yaml; `out=beside`: <model dir>/specpipe.yaml), its `measured`
block holding both splits' figures and the command. A recipe already there (with the default
out=recipes in a checkout, the shipped one) is never replaced silently: as `specpipe train`
does, tune refuses before anything is measured unless `overwrite=true` (outputs.refuse_replacing).
"""

from __future__ import annotations

import gc
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from rich.console import Console

from specpipe import machine
from specpipe.bench.partial import PARTIAL_FILE
from specpipe.bench.results import environment, now
from specpipe.bench.summary import OVERALL, all_exact
from specpipe.build import checked_context
from specpipe.commands import bench
from specpipe.commands import tune_split as split
from specpipe.config import TuneConfig, compose
from specpipe.errors import SpecpipeError
from specpipe.markup import esc
from specpipe.ui.tables import show
from specpipe.models import zoo
from specpipe.outputs import KEPT_ASIDE, refuse_replacing, save_or_keep, writable_output
from specpipe.pipeline import Pipeline
from specpipe.recipe import (ARTIFACT, RECIPE_FILE, RECIPE_VERSION, as_overrides, load_recipe, load_strategy,
                             strategy_names, with_artifacts, write_recipe)

CARRIED = ("model", "temperature", "top_k", "top_p", "seed", "max_new_tokens", "stop", "prompts",
           "categories", "limit", "warmup", "gamma_min", "gamma_max")  # the user's settings, kept


def run(cfg: DictConfig) -> int:
    check_gammas(cfg)
    prompts, report_prompts = split.select_splits(cfg)  # an overlap is refused before anything is written
    destination = recipe_path(cfg)
    # a recipe there (maybe the shipped one) is replaced only with overwrite=true; a folder there: writable_output
    refuse_replacing([destination] if destination.is_file() else [], cfg.overwrite, "the recipe this tune writes")
    writable_output(destination.parent, f"out={cfg.out}", files=(RECIPE_FILE,))
    writable_output(Path(cfg.work) / model_slug(cfg.model.name), f"work={cfg.work}")
    err = Console(stderr=True)
    choose_cfg = split.split_config(cfg, split.CHOOSE)
    tried = {}
    for name, strategy in [*candidates(cfg, err), *trained(cfg, destination, err)]:
        tried[name] = (strategy, _bench_candidate(choose_cfg, name, strategy, prompts, err))
    if not tried:
        raise SpecpipeError(f"No strategy could run on {cfg.model.name}: see the reasons above.")
    best, report_cfg = winner(tried), split.split_config(cfg, split.REPORT)
    reported = {name: _bench_candidate(report_cfg, name, tried[name][0], report_prompts, err, on=split.REPORT)
                for name in (split.to_report(tried, best) if report_prompts else [])}
    ship, why = split.shipped(tried, best, reported, str(cfg.report_on) if report_prompts else "")
    data = recipe_data(cfg, tried, reported, (ship, why), (prompts, report_prompts))
    if cfg.batch_sizes and data["strategy"].get("proposer", "none") != "none":
        schedule, loads = batch_schedule(choose_cfg, ship, data["strategy"], prompts, err)
        data["strategy"]["batch_schedule"] = schedule
        data["measured"]["batch_schedule"] = loads
    try:  # written first: a stdout gone bad loses no recipe
        path = save_or_keep(lambda to: write_recipe(to, data), destination, "the recipe")
    finally:
        show(split.table(cfg, tried, reported, (ship, why)))
    err.print(f"recipe: {esc(path)}  (use it: specpipe generate recipe={esc(path)})")
    return 0


def check_gammas(cfg: DictConfig) -> None:
    """Each γ of `gammas=` (and size of `batch_sizes=`) held to what `gamma=` is held to, and refused
    under its own name: the user typed gammas=, not gamma=."""
    from specpipe.checks.validate import check_settings

    given = f"gammas={list(cfg.gammas)}"
    if not cfg.gammas:
        raise SpecpipeError("gammas=[] holds no γ: give the fixed γ values to try, e.g. gammas=[2,4,6].")
    for gamma in cfg.gammas:
        if gamma < 1:
            raise SpecpipeError(f"{given} holds γ={gamma}, and each γ tried is at least 1 draft token a step (the "
                                "plain target is measured beside every candidate anyway). Give gammas= values of 1 "
                                "or more, e.g. gammas=[2,4,6]. Nothing was measured.")
        if not cfg.gamma_min <= gamma <= cfg.gamma_max:
            raise SpecpipeError(f"{given} holds γ={gamma}, outside gamma_min={cfg.gamma_min} .. gamma_max="
                                f"{cfg.gamma_max}, the bounds every candidate runs within. Give gammas= values in "
                                f"that range, or widen it (gamma_max={max(gamma, cfg.gamma_max)}). Nothing was "
                                "measured.")
        one = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        one.gamma = gamma  # and the controller's copy, resolved from ${gamma} already
        if "gamma" in one.controller:
            one.controller.gamma = gamma
        check = check_settings(one)
        if check.status == "refuse" and f"gamma={gamma}" in check.why:
            why = check.why.replace(f"gamma={gamma}", f"γ={gamma}")
            raise SpecpipeError(f"{given} holds a γ a candidate cannot run with: {why}. Give gammas= values in "
                                "that range. Nothing was measured.")
    small = [size for size in cfg.batch_sizes if size < 1]
    if small:
        raise SpecpipeError(f"batch_sizes={list(cfg.batch_sizes)}: {small[0]} is no batch size (at least 1, and "
                            "sizes above 1 are measured). Nothing was measured.")


def recipe_path(cfg: DictConfig) -> Path:
    if cfg.out == "beside":
        folder = Path(cfg.model.name)
        if not folder.is_dir():
            raise SpecpipeError(f"out=beside writes <model dir>/{RECIPE_FILE}, but model={cfg.model.name} is not a "
                                "directory. Use out=recipes (the default) or out=SOME_DIR.")
        return folder / RECIPE_FILE
    return Path(cfg.out) / model_slug(cfg.model.name) / RECIPE_FILE


def model_slug(name: str) -> str:
    return name if name in zoo.ZOO else Path(name.rstrip("/")).name.replace("/", "--") or "model"


def candidates(cfg: DictConfig, err: Console):
    """(name, strategy mapping) of every candidate that passes its compatibility checks."""
    draft = cfg.draft or next(iter(zoo.drafts_for(cfg.model.name)), "")
    unknown = sorted(set(cfg.strategies) - set(strategy_names()))
    if unknown:
        raise SpecpipeError(f"strategies={unknown} are not built-in strategies: {', '.join(strategy_names())}.")
    for base in list(cfg.strategies) or strategy_names():
        strategy = load_strategy(base)
        if strategy.get("proposer") == "draft":
            if not draft:
                err.print(f"[dim]{base}: skipped (no draft model: pass draft=NAME_OR_PATH)[/dim]")
                continue
            strategy["proposer.model"] = draft
        fixed = strategy.get("controller", "fixed") == "fixed"
        for gamma in (cfg.gammas if fixed else [strategy.get("gamma", cfg.gamma)]):
            candidate = {**strategy, "gamma": int(gamma)}
            name = f"{base}-g{gamma}" if fixed else base
            refused = _refusals(candidate_config(cfg, candidate))
            if refused:
                err.print(f"[dim]{esc(name)}: skipped ({esc(refused)})[/dim]")
                continue
            yield name, candidate


def trained(cfg: DictConfig, destination: Path, err: Console):
    """Recipes of trained heads in the destination folder (`specpipe train` writes them there),
    each with its own γ; their artifact paths stay valid in the recipe written beside them."""
    for path in sorted(destination.parent.glob("*.yaml")):
        if path.name == RECIPE_FILE or KEPT_ASIDE.search(path.name):  # an earlier tune's recipe, kept
            continue
        try:
            recipe = load_recipe(path)
        except SpecpipeError as err_:
            err.print(f"[dim]{esc(path.name)}: skipped (not a usable recipe: {esc(err_)})[/dim]")
            continue
        if recipe.target != cfg.model.name:
            err.print(f"[dim]{esc(path.name)}: skipped (trained for {esc(recipe.target)})[/dim]")
            continue
        yield path.stem, {**recipe.strategy, **{f"{ARTIFACT}{k}": v for k, v in recipe.artifacts.items()}}


def candidate_config(cfg: DictConfig, strategy: dict) -> DictConfig:
    """The bench config of one candidate: its strategy, with the user's target and settings."""
    candidate = compose(as_overrides(_resolved(cfg, strategy)), "bench")
    with open_dict(candidate):
        for key in CARRIED:
            candidate[key] = cfg[key]
    return candidate


def _resolved(cfg: DictConfig, strategy: dict) -> dict:
    """Settings only: a candidate's artifacts ride along as "artifact:NAME": path entries;
    "artifact:NAME" values become those paths inside the recipe folder."""
    artifacts = {k[len(ARTIFACT):]: v for k, v in strategy.items() if k.startswith(ARTIFACT)}
    settings = {k: v for k, v in strategy.items() if not k.startswith(ARTIFACT)}
    return with_artifacts(settings, artifacts, recipe_path(cfg).parent)


def _refusals(cfg: DictConfig) -> str:
    _, checks = checked_context(cfg)
    return "; ".join(f"{c.name}: {c.why}" for c in checks if c.status == "refuse")


def _bench_candidate(cfg: DictConfig, name: str, strategy: dict, prompts: list[dict], err: Console,
                     load: int = 0, on: str = "") -> dict:
    """One candidate's results (an earlier run's if it finished): per prompt, or with `load` a
    request load at that concurrency. `on=report_on`: on the report split, kept in a folder of
    its own inside the candidate's."""
    folder = Path(cfg.work) / model_slug(cfg.model.name) / name / on
    label = f"{name} on {cfg.prompts}" if on else name
    candidate = candidate_config(cfg, strategy)
    if load:
        with open_dict(candidate):
            candidate.concurrency, candidate.requests = load, max(int(cfg.requests), 2 * load)
    earlier = bench.earlier_run(folder, candidate, prompts, label, err)
    if earlier is not None:
        return earlier
    err.rule(esc(label))
    pipeline = Pipeline.from_config(candidate)
    folder.mkdir(parents=True, exist_ok=True)
    try:  # per prompt, what is measured is kept in the candidate's folder: an interrupted tune resumes there
        payload = (bench.measure_requests(candidate, pipeline, prompts, [], err) if load else
                   bench.measure(candidate, pipeline, prompts, [], err, folder))
    finally:
        del pipeline
        gc.collect()  # one target in memory at a time
    bench.save(payload, folder)
    (folder / PARTIAL_FILE).unlink(missing_ok=True)
    return payload


def batch_schedule(cfg: DictConfig, name: str, strategy: dict, prompts: list[dict],
                   err: Console) -> tuple[dict[int, int], dict]:
    """({batch size: best γ}, the speedups measured) for the winning strategy: at each size of
    `batch_sizes`, a request load per γ of `gammas` with the fixed controller; γ = 0 where no γ
    beats plain batched decoding with every output identical. Batch 1 keeps the winner's γ."""
    schedule = {1: int(strategy.get("gamma", cfg.gamma))} if strategy.get("controller", "fixed") == "fixed" else {}
    measured: dict = {}
    for size in sorted({int(s) for s in cfg.batch_sizes if int(s) > 1}):
        speedups = {}
        for gamma in cfg.gammas:
            settings = {**strategy, "controller": "fixed", "gamma": int(gamma)}
            settings.pop("batch_schedule", None)
            payload = _bench_candidate(cfg, f"{name}-batch{size}-g{gamma}", settings, prompts, err, load=size)
            load = payload["load"]
            if load["exact"] is None or load["exact"]["share"] == 1.0:
                speedups[int(gamma)] = load["speedup"]
        best = max(speedups, key=speedups.get, default=None)
        schedule[size] = best if best is not None and speedups[best] > 1.0 else 0
        measured[size] = {"speedup_by_gamma": {g: round(v, 3) for g, v in speedups.items()}, "gamma": schedule[size]}
        err.print(f"batch {size}: γ={schedule[size]} ({', '.join(f'γ={g} x{v:.2f}' for g, v in speedups.items())})",
                  highlight=False)
    return schedule, measured


def winner(tried: dict) -> str | None:
    """The best overall median speedup among exact candidates; None if none beats plain."""
    scored = {name: p["summary"][OVERALL]["speedup"]["median"] for name, (_, p) in tried.items()
              if all_exact(p["summary"][OVERALL])}
    best = max(scored, key=scored.get, default=None)
    return best if best is not None and scored[best] > 1.0 else None


def recipe_data(cfg: DictConfig, tried: dict, reported: dict, ship: tuple[str | None, str],
                splits: tuple[list[dict], list[dict]]) -> dict:
    name, why = ship
    strategy = tried[name][0] if name else {"proposer": "none", "controller": "fixed"}
    target = "." if cfg.out == "beside" else cfg.model.name
    where = f"chosen on {cfg.choose_on}" + (f", reported on {cfg.report_on}" if reported else "")
    return {
        "specpipe_recipe": RECIPE_VERSION,
        "about": f"specpipe tune, {now()}: {name or 'plain decoding'}, of {len(tried)} candidates {where}",
        "target": target,
        "strategy": {k: v for k, v in strategy.items() if k != "about" and not k.startswith(ARTIFACT)},
        "artifacts": {k[len(ARTIFACT):]: v for k, v in strategy.items() if k.startswith(ARTIFACT)},
        "measured": _measured(cfg, tried, reported, ship, splits),
        "versions": environment()["versions"],
    }


def _measured(cfg: DictConfig, tried: dict, reported: dict, ship: tuple[str | None, str],
              splits: tuple[list[dict], list[dict]]) -> dict:
    """The shipped strategy's figures on the report split (on the choose split without one), and
    every candidate's median and spread on each split it was measured on."""
    name, why = ship
    payload = (reported.get(name) or tried[name][1]) if name else None
    overall = payload["summary"][OVERALL] if payload else None
    choose = {n: p for n, (_, p) in tried.items()}
    return {
        # what check and generate compare this machine with (a device or CPU that changes the choice)
        "tuned_on": machine.tuned_on(str(cfg.device), str(cfg.model.quantize), now()[:10]),
        "command": command(cfg),
        "winner": name or "plain",
        "chosen": winner(tried) or "plain",  # the best on the choose split (the winner unless the report split said no)
        "why": why,
        "figures_from": (split.REPORT if name in reported else split.CHOOSE) if name else None,
        "speedup_median": overall["speedup"]["median"] if overall else 1.0,
        "speedup_by_category": {c: f["speedup"]["median"] for c, f in payload["summary"].items()} if payload else {},
        "acceptance_rate": overall["acceptance_rate"] if overall else None,
        "mean_accepted_length": overall["mean_accepted_length"] if overall else None,
        "gamma_mean": overall["gamma"]["mean"] if overall else 0,  # what an export fixes γ to
        "tokens_per_s": overall["tokens_per_s"] if overall else None,
        "baseline_tokens_per_s": overall["baseline_tokens_per_s"] if overall else None,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        split.CHOOSE: split.split_figures(cfg, split.CHOOSE, splits[0], choose),
        split.REPORT: split.split_figures(cfg, split.REPORT, splits[1], reported) if reported else None,
        "machine": {k: v for k, v in environment().items() if k != "versions"},
    }


REPRODUCE = ("choose_on", "report_on", "categories", "limit", "max_new_tokens", "warmup", "temperature", "top_k",
             "top_p", "seed", "strategies", "gammas", "draft", "batch_sizes", "requests", "device", "engine", "out")


def command(cfg: DictConfig) -> str:
    """The `specpipe tune` command line that measures this again: both splits, and the settings
    that differ from tune's defaults (the trained-head candidates come from the recipes beside `out=`)."""
    defaults = OmegaConf.to_container(OmegaConf.structured(TuneConfig), resolve=False)
    words = ["specpipe", "tune", f"model={cfg.model.name}"]
    if cfg.model.quantize != compose([f"model={cfg.model.name}", f"device={cfg.device}"], "tune").model.quantize:
        words.append(f"model.quantize={cfg.model.quantize}")
    for key in REPRODUCE:
        value = OmegaConf.to_container(cfg[key]) if OmegaConf.is_config(cfg[key]) else cfg[key]
        if key in (split.CHOOSE, split.REPORT) or value != defaults.get(key):
            words.append(f"{key}=[{','.join(map(str, value))}]" if isinstance(value, list) else f"{key}={value}")
    return " ".join(shlex.quote(w) for w in words)
