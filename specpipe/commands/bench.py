"""`specpipe bench`: one strategy over a prompt set, against the plain target (and peers).

With `requests=N concurrency=C` it is a request load instead (bench/load.py): N requests drawn
from the prompt set through continuous batching, C at a time, plain and speculative.

Single run: results.json (and plots) in `out=` (an older results.json there is kept, renamed
with its date). Under `-m` (Hydra multirun) each job writes into its own folder of the sweep,
named by its settings; a job whose results.json exists already finished and is skipped, so
running the same sweep command again resumes an interrupted sweep. Skipped only if measured
with the same settings (results.py `measured_with`: the prompts, limit, max_new_tokens...,
some of which the folder's name leaves out): else measured again, saying what changed.

The output folder is checked before any model loads; if writing fails after the measurement
anyway, the results are kept elsewhere and the error names where (specpipe/outputs.py).
"""

from __future__ import annotations

import gc
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from specpipe.bench import plots
from specpipe.bench.partial import PARTIAL_FILE, KeptResults
from specpipe.bench.load import load_summary, measure_load
from specpipe.bench.peers import hf_batched, load_peer_names, make_peers, peer_names
from specpipe.bench.results import RESULTS_FILE, SCHEMA, earlier_results, environment, measured_with, now, write_json
from specpipe.bench.runner import WARMUP_TOKENS, bench_prompts, warm_up
from specpipe.bench.spec_bench import is_spec_bench, spec_bench_table
from specpipe.bench.summary import all_exact, summarize
from specpipe.bench.table import bench_table, load_table
from specpipe.build import resolved
from specpipe.checks.identity import kind_of, proposer_kind
from specpipe.commands.check import capped_cache
from specpipe.context import check_fits
from specpipe.errors import SpecpipeError
from specpipe.limits import fit_slots
from specpipe.markup import esc
from specpipe.ui.tables import show
from specpipe.outputs import keep_aside, save_or_keep, writable_output
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts


def run(cfg: DictConfig) -> int:
    prompts = select_prompts(cfg)
    load = cfg.requests > 0
    lowered = fit_slots(cfg, cfg.requests, "concurrency") if load else None  # before the checks read it
    peers = load_peer_names(cfg.peer) if load else peer_names(cfg.peer, cfg.proposer, cfg.engine)
    folder, in_sweep = job_folder(cfg)
    err = Console(stderr=True)
    if in_sweep and earlier_run(folder, cfg, prompts, folder.name, err) is not None:
        return 0
    writable_output(folder, f"out={cfg.out}", files=(RESULTS_FILE,))
    gc.collect()  # a sweep runs its jobs in one process: the last job's models must be gone first
    with err.status(f"loading {esc(cfg.model.name)} and the proposer…"):
        settings = resolved(cfg)  # once: the checks and the build read this value
        for note in (lowered, capped_cache(settings)):
            if note:
                err.print(f"note: {esc(note)}", highlight=False)
        pipeline = Pipeline.from_config(cfg, settings)
    for warning in pipeline.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning.name}: {esc(warning.why)}", highlight=False)
    payload = measure_requests(cfg, pipeline, prompts, peers, err) if load else measure(cfg, pipeline, prompts,
                                                                                         peers, err, folder)
    try:  # saved first: a stdout gone bad (a closed pipe, a full disk) loses no measurement
        path = save(payload, folder)
        (folder / PARTIAL_FILE).unlink(missing_ok=True)  # every prompt is in results.json now
    finally:  # seen, whatever happened to the file (a write kept elsewhere raises, naming where)
        show(load_table(payload) if load else bench_table(payload))
        if not load and is_spec_bench(cfg.prompts):  # also as the field reports it, beside its papers' numbers
            show(spec_bench_table(payload))
    err.print(f"results: {esc(path)}")
    if cfg.plot:
        for png in plots.plot_run(payload, folder):
            err.print(f"plot: {esc(png)}")
    # exit 1 on a greedy divergence (scripts can gate on it); a sweep's job records it and goes on
    return 0 if in_sweep or all_exact(payload["summary"]["overall"]) else 1


def select_prompts(cfg: DictConfig) -> list[dict]:
    if cfg.max_new_tokens < 1 or cfg.limit < 0 or cfg.warmup < 0 or cfg.requests < 0 or cfg.concurrency < 1:
        raise SpecpipeError("max_new_tokens and concurrency must be at least 1, and limit, warmup and requests at "
                            f"least 0 (got max_new_tokens={cfg.max_new_tokens} concurrency={cfg.concurrency} "
                            f"limit={cfg.limit} warmup={cfg.warmup} requests={cfg.requests}).")
    prompts = load_prompts(cfg.prompts, list(cfg.categories) or None)
    if not prompts:
        raise SpecpipeError(f"prompts={cfg.prompts} has no prompt in categories {list(cfg.categories)}. "
                            "Drop categories= or name categories the set has.")
    if cfg.limit:
        by_category: dict[str, list] = {}
        for prompt in prompts:
            by_category.setdefault(prompt.get("category", ""), []).append(prompt)
        prompts = [p for group in by_category.values() for p in group[: cfg.limit]]
    return prompts


def job_folder(cfg: DictConfig) -> tuple[Path, bool]:
    """(where this run writes, whether it is a job of a multirun sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().runtime.output_dir), True
    return Path(cfg.out), False


def earlier_run(folder: Path, cfg: DictConfig, prompts: list[dict], name: str, err: Console) -> dict | None:
    """The results.json in `folder` if measured with these settings; None if there is none, or
    if it was measured otherwise (said so: it is measured again, the earlier file kept renamed)."""
    earlier, changed = earlier_results(folder / RESULTS_FILE, measured_with(cfg, prompts))
    if earlier is not None:
        err.print(f"[dim]{esc(name)}: measured in an earlier run with the same settings, skipped ({esc(folder)})[/dim]")
    elif changed:
        err.print(f"{esc(name)}: measured in an earlier run with other settings ({esc('; '.join(changed))}): measuring "
                  f"again, the earlier {RESULTS_FILE} kept renamed with its date ({esc(folder)})", highlight=False)
    return earlier


def measure(cfg: DictConfig, pipeline: Pipeline, prompts: list[dict], peers: list[str], err: Console,
            folder: Path | None = None) -> dict:
    """folder: where each prompt's result is kept as it comes (bench/partial.py), and an interrupted
    run's are read back from: only the prompts left are measured."""
    check_fits(pipeline, prompts, cfg.max_new_tokens)  # every prompt fits, named by id, before anything runs
    kept = KeptResults(folder or Path(cfg.out), measured_with(cfg, prompts))
    if kept.resumed:
        err.print(f"resuming: {kept.resumed} of {len(prompts)} prompts measured by an interrupted run with the same "
                  f"settings ({esc(kept.path)}); measuring the rest", highlight=False)
    elif kept.set_aside:
        err.print(f"an interrupted run's {PARTIAL_FILE} here was measured otherwise ({esc(kept.why_aside)}): kept as "
                  f"{esc(kept.set_aside)}; measuring from the start", highlight=False)
    peer_runs = make_peers(peers, pipeline, cfg)
    with err.status("warming up…"):
        warm_up(pipeline, pipeline.encode(prompts[0]["messages"]), peer_runs, cfg.warmup, cfg.seed)

    def show(result) -> None:
        exact = {None: "", True: " exact", False: " [red]DIVERGED[/red]"}[result.exact]
        err.print(f"{esc(result.id)} ({esc(result.category)}): {result.baseline.tokens_per_s:.1f} → "
                  f"{result.speculative.tokens_per_s:.1f} tok/s x{result.speedup:.2f} "
                  f"τ={result.speculative.stats['mean_accepted_length']:.2f}{exact}", highlight=False, soft_wrap=True)

    _print_engine(pipeline, pipeline.memory(), err)
    def show_and_keep(result) -> None:
        show(result)
        kept.keep(result)

    try:
        results = bench_prompts(pipeline, prompts, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                stop=list(cfg.stop), peers=peer_runs, on_result=show_and_keep, done=kept.done)
    except KeyboardInterrupt:
        if kept.done:
            err.print(f"interrupted: {len(kept.done)} of {len(prompts)} prompts kept in {esc(kept.path)}; the same "
                      "command resumes from there", highlight=False)
        raise
    return {**_header(cfg, pipeline, prompts), "memory_bytes": pipeline.memory(),
            "prompts": [r.to_dict() for r in results], "summary": summarize(results)}


def measure_requests(cfg: DictConfig, pipeline: Pipeline, prompts: list[dict], peers: list[str], err: Console) -> dict:
    """A request load (bench/load.py), after a warm-up stream of one batch in both modes."""
    check_fits(pipeline, prompts, cfg.max_new_tokens)
    peer_runs = {name: hf_batched(pipeline, cfg.concurrency) for name in peers}
    options = dict(concurrency=cfg.concurrency, seed=cfg.seed, stop=list(cfg.stop))
    with err.status("warming up…"):
        for _ in range(cfg.warmup):
            measure_load(pipeline, prompts, requests=cfg.concurrency, max_new_tokens=WARMUP_TOKENS, **options)
    with err.status(f"serving {cfg.requests} requests, {cfg.concurrency} at a time, plain then speculative"
                    + (f", then {', '.join(peers)}" if peers else "") + "…"):
        load = measure_load(pipeline, prompts, requests=cfg.requests, max_new_tokens=cfg.max_new_tokens,
                            peers=peer_runs, **options)
    _print_engine(pipeline, load["memory_bytes"], err)
    if load["batch_refusal"]:
        err.print(f"[yellow]warning:[/yellow] one sequence at a time: {esc(load['batch_refusal'])}", highlight=False)
    return {**_header(cfg, pipeline, prompts), "memory_bytes": load["memory_bytes"], "prompts": [],
            "summary": load_summary(load), "load": load}


def _print_engine(pipeline: Pipeline, memory: dict, err: Console) -> None:
    compiled = getattr(pipeline.runner, "compile_s", None)
    err.print(f"engine: {pipeline.runner.engine} {pipeline.runner.precision}, {pipeline.runner.step} steps"
              + (f", decoder stack compiled (first call {compiled:.0f} s)" if compiled else "")
              + "; memory: " + ", ".join(f"{part} {size / 2**20:.0f} MiB" for part, size in memory.items()),
              highlight=False)


def _header(cfg: DictConfig, pipeline: Pipeline, prompts: list[dict]) -> dict:
    return {
        "schema": SCHEMA,
        "created": now(),
        "model": cfg.model.name,
        "strategy": {"proposer": proposer_kind(cfg), "verifier": kind_of(cfg.verifier), "controller": kind_of(cfg.controller),
                     "gamma": cfg.gamma, "lossless": pipeline.verifier.lossless, "guard": bool(cfg.get("guard", True))},
        "config": OmegaConf.to_container(cfg, resolve=True),
        "measured_with": measured_with(cfg, prompts),
        "environment": environment(),
        "engine": {"target": pipeline.runner.engine, "precision": pipeline.runner.precision,
                   "step": pipeline.runner.step, "compile_s": getattr(pipeline.runner, "compile_s", None)},
    }


def save(payload: dict, folder: Path) -> Path:
    """results.json in `folder` (an older one there is kept, renamed with its date); if the
    folder refuses it, kept elsewhere and a SpecpipeError names where (outputs.save_or_keep)."""
    def write(path: Path) -> Path:
        if path.is_file():
            keep_aside(path)  # nothing measured earlier is lost
        return write_json(path, payload)

    return save_or_keep(write, folder / RESULTS_FILE, "the results")
