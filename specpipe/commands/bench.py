"""`specpipe bench`: one strategy over a prompt set, against the plain target (and peers).

Single run: results.json (and plots) in `out=` (an older results.json there is kept, renamed
with its date). Under `-m` (Hydra multirun) each job writes into its own folder of the sweep,
named by its settings; a job whose results.json exists already finished and is skipped, so
running the same sweep command again resumes an interrupted sweep.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from specpipe.bench import plots
from specpipe.bench.peers import make_peers, peer_names
from specpipe.bench.results import RESULTS_FILE, environment, now, read_results, write_json
from specpipe.bench.runner import bench_prompts, warm_up
from specpipe.bench.summary import all_exact, summarize
from specpipe.bench.table import bench_table
from specpipe.checks import kind_of, proposer_kind
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts


def run(cfg: DictConfig) -> int:
    prompts = select_prompts(cfg)
    peers = peer_names(cfg.peer, proposer_kind(cfg))
    folder, in_sweep = job_folder(cfg)
    err = Console(stderr=True)
    if in_sweep and (folder / RESULTS_FILE).is_file():
        read_results(folder / RESULTS_FILE)  # a damaged file is an error, not a finished job
        err.print(f"[dim]{folder}: finished in an earlier run, skipped[/dim]")
        return 0
    gc.collect()  # a sweep runs its jobs in one process: the last job's models must be gone first
    with err.status(f"loading {cfg.model.name} and the proposer…"):
        pipeline = Pipeline.from_config(cfg)
    for warning in pipeline.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning.name}: {warning.why}", highlight=False)
    payload = measure(cfg, pipeline, prompts, peers, err)
    path = save(payload, folder, keep_previous=not in_sweep)
    Console().print(bench_table(payload))
    err.print(f"results: {path}")
    if cfg.plot:
        for png in plots.plot_run(payload, folder):
            err.print(f"plot: {png}")
    # exit 1 on a greedy divergence (scripts can gate on it); a sweep's job records it and goes on
    return 0 if in_sweep or all_exact(payload["summary"]["overall"]) else 1


def select_prompts(cfg: DictConfig) -> list[dict]:
    if cfg.max_new_tokens < 1 or cfg.limit < 0 or cfg.warmup < 0:
        raise SpecpipeError("max_new_tokens must be at least 1, and limit and warmup at least 0 "
                            f"(got max_new_tokens={cfg.max_new_tokens} limit={cfg.limit} warmup={cfg.warmup}).")
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


def measure(cfg: DictConfig, pipeline: Pipeline, prompts: list[dict], peers: list[str], err: Console) -> dict:
    peer_runs = make_peers(peers, pipeline, cfg)
    with err.status("warming up…"):
        warm_up(pipeline, pipeline.encode(prompts[0]["messages"]), peer_runs, cfg.warmup, cfg.seed)

    def show(result) -> None:
        exact = {None: "", True: " exact", False: " [red]DIVERGED[/red]"}[result.exact]
        err.print(f"{result.id} ({result.category}): {result.baseline.tokens_per_s:.1f} → "
                  f"{result.speculative.tokens_per_s:.1f} tok/s x{result.speedup:.2f} "
                  f"τ={result.speculative.stats['mean_accepted_length']:.2f}{exact}", highlight=False, soft_wrap=True)

    compiled = getattr(pipeline.runner, "compile_s", None)
    err.print(f"engine: {pipeline.runner.engine} {pipeline.runner.precision}"
              + (f", decoder stack compiled (first call {compiled:.0f} s)" if compiled else "")
              + "; memory: " + ", ".join(f"{part} {size / 2**20:.0f} MiB" for part, size in pipeline.memory().items()),
              highlight=False)
    results = bench_prompts(pipeline, prompts, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                            stop=list(cfg.stop), peers=peer_runs, on_result=show)
    return {
        "schema": "specpipe.bench/1",
        "created": now(),
        "model": cfg.model.name,
        "strategy": {"proposer": proposer_kind(cfg), "verifier": kind_of(cfg.verifier), "controller": kind_of(cfg.controller),
                     "gamma": cfg.gamma, "lossless": pipeline.verifier.lossless},
        "config": OmegaConf.to_container(cfg, resolve=True),
        "environment": environment(),
        "engine": {"target": pipeline.runner.engine, "precision": pipeline.runner.precision,
                   "compile_s": getattr(pipeline.runner, "compile_s", None)},
        "memory_bytes": pipeline.memory(),
        "prompts": [r.to_dict() for r in results],
        "summary": summarize(results),
    }


def save(payload: dict, folder: Path, keep_previous: bool) -> Path:
    path = folder / RESULTS_FILE
    if keep_previous and path.is_file():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        path.rename(folder / f"results-{stamp}.json")  # nothing measured earlier is lost
    return write_json(path, payload)

