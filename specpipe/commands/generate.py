"""`specpipe generate`: one prompt, speculatively with a live view, then the plain target.

Where a speedup is printed (output=rich or json, baseline=true), one short warm-up of both modes
runs first, as bench's does: a first call's kernel set-up is not part of the figure.

Several `prompt=` (or `batch=N`) decode as a batch (specpipe/decode/loop.py): every prompt at once, or
N at a time with continuous batching, then the plain target as the same batch; the figures are
the batch's throughput (output tokens over the wall time, prefills included).
"""

from __future__ import annotations

import sys
import time

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from specpipe import jsonsafe
from specpipe.bench.runner import warm_up
from specpipe.build import resolved
from specpipe.checks.identity import proposer_kind
from specpipe.checks.result import refuse_if_any
from specpipe.checks.validate import check_prompts, check_settings
from specpipe.commands.check import capped_cache, prompt_room
from specpipe.limits import fit_slots
from specpipe.markup import esc
from specpipe.pipeline import Generation, Pipeline, collect
from specpipe.ui.live import stream, summary

def run(cfg: DictConfig, prompts: list[str] | None = None) -> None:
    """prompts: the command line's `prompt=` texts, verbatim (None: the config's `prompt`)."""
    prompts = prompts or [cfg.prompt]
    err = Console(stderr=True)
    lowered = fit_slots(cfg, len(prompts), "batch")  # before the settings: their memory estimate reads it
    refuse_if_any([check_settings(cfg), check_prompts(prompts)])  # no download for a value refused anyway
    with err.status(f"loading {esc(cfg.model.name)} and the proposer…"):
        settings = resolved(cfg)  # once: the checks and the build read this value
        refuse_if_any([prompt_room(settings, prompts)])  # what `specpipe check` counts, before any weights load
        for note in (lowered, capped_cache(settings)):
            if note:
                err.print(f"note: {esc(note)}", highlight=False)
        pipeline = Pipeline.from_config(cfg, settings)
    for warning in pipeline.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning.name}: {esc(warning.why)}", highlight=False)
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, stop=list(cfg.stop))
    if _compares(cfg, pipeline):  # first calls pay kernel set-up: not in a speedup it prints
        with err.status("warming up…"):
            warm_up(pipeline, pipeline.encode(prompts[0]), [], 1, cfg.seed)
    if len(prompts) > 1 or cfg.batch > 1:
        return _batch(cfg, pipeline, prompts, kwargs, err)
    prompt = prompts[0]
    spec = _speculative(pipeline, cfg, prompt, kwargs)
    base = None
    if _compares(cfg, pipeline):
        with err.status("running the plain target on the same prompt…"):
            base = pipeline.run(prompt, speculative=False, **kwargs)
    equal = spec.token_ids == base.token_ids if base is not None and pipeline.sampling.greedy else None
    if cfg.output == "json":
        print(jsonsafe.dumps({**_as_json(cfg, pipeline, spec, base, equal), "prompt": prompt}))
    elif cfg.output == "rich":
        Console().print(summary(spec.stats, base and base.stats, equal, not pipeline.verifier.lossless))


def _batch(cfg: DictConfig, pipeline: Pipeline, prompts: list[str], kwargs: dict, err: Console) -> None:
    """The prompts as one batch (`batch` at a time), then the plain target as the same batch."""
    concurrency = cfg.batch or len(prompts)
    if pipeline.batch_refusal(pipeline.proposer):
        err.print(f"[yellow]warning:[/yellow] one sequence at a time: {esc(pipeline.batch_refusal(pipeline.proposer))}",
                  highlight=False)
        concurrency = 1  # what runs, and what the output reports
    runs = {}
    for mode in ("speculative", "plain") if _compares(cfg, pipeline) else ("speculative",):
        with err.status(f"decoding {len(prompts)} prompts, {concurrency} at a time ({mode})…"):
            started = time.perf_counter()
            outs = pipeline.generate_batch(prompts, concurrency=concurrency, speculative=mode == "speculative",
                                           **kwargs)
            runs[mode] = (outs, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started))
    spec, throughput = runs["speculative"]
    base, base_throughput = runs.get("plain", (None, None))
    equal = [s.token_ids == b.token_ids for s, b in zip(spec, base)] if base and pipeline.sampling.greedy else None
    if cfg.output == "json":
        print(jsonsafe.dumps({
            "model": cfg.model.name, "proposer": proposer_kind(cfg), "batch": concurrency,
            "config": {**OmegaConf.to_container(cfg, resolve=True), "prompt": prompts},
            "requests": [_request_json(p, g, base[i] if base else None, equal[i] if equal else None)
                         for i, (p, g) in enumerate(zip(prompts, spec))],
            "tokens_per_s": throughput, "baseline_tokens_per_s": base_throughput,
            "speedup": throughput / base_throughput if base_throughput else None,
            "greedy_equal": None if equal is None else all(equal),
        }))
        return
    for i, g in enumerate(spec):
        if cfg.output == "text":
            sys.stdout.write(g.text + "\n\n")
        else:
            Console().rule(f"prompt {i + 1}/{len(prompts)} · {len(g.token_ids)} tokens · τ="
                           f"{g.stats.mean_accepted_length:.2f} · {g.finish_reason}")
            Console().print(g.text, highlight=False, markup=False)
    if cfg.output == "rich":
        line = f"batch of {len(prompts)} ({concurrency} at a time): {throughput:.1f} tok/s"
        if base_throughput:
            line += f", plain target {base_throughput:.1f} tok/s, speedup x{throughput / base_throughput:.2f}"
        if equal is not None:
            line += ", greedy output " + ("identical" if all(equal) else
                                          f"[red]DIFFERS on {len(equal) - sum(equal)} prompt(s)[/red]")
        Console().print(line, highlight=False)


def _compares(cfg: DictConfig, pipeline: Pipeline) -> bool:
    """Whether the plain target runs too: a speedup is printed (output=text prints none, so it
    does not spend a second decode on one)."""
    return bool(cfg.baseline) and pipeline.proposer is not None and cfg.output != "text"


def _request_json(prompt: str, spec: Generation, base: Generation | None, equal: bool | None) -> dict:
    """One request of a batch: its own greedy_equal and the plain target's ids beside its own, so a
    request that diverges is found by its index, not only by the batch's overall flag."""
    return {"prompt": prompt, "text": spec.text, "token_ids": spec.token_ids, "finish_reason": spec.finish_reason,
            **spec.stats.to_dict(), "baseline_token_ids": base.token_ids if base else None, "greedy_equal": equal}


def _speculative(pipeline: Pipeline, cfg: DictConfig, prompt: str, kwargs: dict) -> Generation:
    if cfg.output == "rich":
        title = f"{esc(cfg.model.name)} · proposer {proposer_kind(cfg)} · γ={cfg.gamma}"
        return stream(pipeline, prompt, Console(), title, **kwargs)
    if cfg.output == "text":
        generation = collect(_echoed(pipeline.generate(prompt, **kwargs)))
        sys.stdout.write("\n")
        return generation
    return pipeline.run(prompt, **kwargs)


def _echoed(events):
    """The events, each one's text written to standard output as it comes."""
    for event in events:
        sys.stdout.write(event.text)
        sys.stdout.flush()
        yield event


def _as_json(cfg, pipeline: Pipeline, spec: Generation, base: Generation | None, equal) -> dict:
    out = {
        "model": cfg.model.name,
        "proposer": proposer_kind(cfg),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "text": spec.text,
        "token_ids": spec.token_ids,
        "finish_reason": spec.finish_reason,
        "lossless": pipeline.verifier.lossless,
        **spec.stats.to_dict(),
        "baseline_tokens_per_s": None,
        "speedup": None,
        "greedy_equal": equal,
    }
    if base is not None:
        out["baseline_tokens_per_s"] = base.stats.tokens_per_s
        out["speedup"] = spec.stats.tokens_per_s / base.stats.tokens_per_s
        out["baseline_token_ids"] = base.token_ids
    return out
