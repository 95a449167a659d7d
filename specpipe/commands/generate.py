"""`specpipe generate`: one prompt, speculatively with a live view, then the plain target."""

from __future__ import annotations

import json
import sys

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from specpipe.checks import proposer_kind
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Generation, Pipeline
from specpipe.ui.live import stream, summary

OUTPUTS = ("rich", "json", "text")


def run(cfg: DictConfig) -> None:
    _validate(cfg)
    err = Console(stderr=True)
    with err.status(f"loading {cfg.model.name} and the proposer…"):
        pipeline = Pipeline.from_config(cfg)
    for warning in pipeline.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning.name}: {warning.why}", highlight=False)
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, stop=list(cfg.stop))
    spec = _speculative(pipeline, cfg, kwargs)
    base = None
    if cfg.baseline and pipeline.proposer is not None:
        with err.status("running the plain target on the same prompt…"):
            base = pipeline.run(cfg.prompt, speculative=False, **kwargs)
    equal = spec.token_ids == base.token_ids if base is not None and pipeline.sampling.greedy else None
    if cfg.output == "json":
        print(json.dumps(_as_json(cfg, pipeline, spec, base, equal)))
    elif cfg.output == "rich":
        Console().print(summary(spec.stats, base and base.stats, equal, not pipeline.verifier.lossless))


def _validate(cfg: DictConfig) -> None:
    if cfg.output not in OUTPUTS:
        raise SpecpipeError(f"output={cfg.output} is not known: use one of {', '.join(OUTPUTS)}.")
    if cfg.max_new_tokens < 1:
        raise SpecpipeError(f"max_new_tokens={cfg.max_new_tokens} must be at least 1.")
    if not cfg.prompt:
        raise SpecpipeError('prompt is empty: pass prompt="your text".')


def _speculative(pipeline: Pipeline, cfg: DictConfig, kwargs: dict) -> Generation:
    if cfg.output == "rich":
        title = f"{cfg.model.name} · proposer {proposer_kind(cfg)} · γ={cfg.gamma}"
        return stream(pipeline, cfg.prompt, Console(), title, **kwargs)
    if cfg.output == "text":
        tokens, text, event = [], "", None
        for event in pipeline.generate(cfg.prompt, **kwargs):
            sys.stdout.write(event.text)
            sys.stdout.flush()
            tokens.extend(event.tokens)
            text += event.text
        sys.stdout.write("\n")
        return Generation(tokens, text, event.finish_reason, event.stats)
    return pipeline.run(cfg.prompt, **kwargs)


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
