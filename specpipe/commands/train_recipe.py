"""The recipe `specpipe train` writes beside the heads it trained: the strategy that runs them
(controller and lookup by what the head declares) and the figures of the run."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe import machine
from specpipe.bench.results import environment, now
from specpipe.checks.identity import declared
from specpipe.recipe import RECIPE_VERSION


def controller(cfg: DictConfig) -> dict:
    """A head that reports its confidence drafts until it doubts (controller=confidence, up to
    γ 6): on SmolLM2 that was the best overall of fixed γ 1/2/4, cost and confidence for both
    EAGLE heads (README, "Draft heads"), since their acceptance falls fast with depth and each
    draft token costs ~8% of a plain step. Medusa
    heads guess all positions at once: a fixed γ of their number. A head that takes a lookup
    gets it (proposer.lookup): prompt lookup copies what heads trained here guess worst (code
    edits, summaries), measured 1.09x -> 1.66x overall for the SmolLM2 EAGLE-3 head."""
    declaration = declared(cfg)
    lookup = {"proposer.lookup": True} if declaration.lookup else {}
    if declaration.early_stop:
        return {**lookup, "controller": "confidence", "gamma_max": max(6, cfg.num_heads)}
    return {**lookup, "controller": "fixed", "gamma": cfg.num_heads}


def recipe(cfg: DictConfig, name: str, figures: dict[str, list[float]], examples: int, seconds: float) -> dict:
    return {
        "specpipe_recipe": RECIPE_VERSION,
        "about": f"{name} heads trained by specpipe train, {now()}",
        "target": cfg.model.name,
        "strategy": {"proposer": name, "proposer.heads": "artifact:heads", "verifier": "greedy", **controller(cfg)},
        "artifacts": {"heads": name},
        # train has no device setting: it runs on the CPU
        "measured": {"tuned_on": machine.tuned_on("cpu", str(cfg.model.quantize), now()[:10]),
                     **{k: [round(a, 4) for a in v] for k, v in figures.items()}, "train_positions": examples,
                     "tokens": cfg.tokens, "sources": list(cfg.sources), "distill": cfg.distill,
                     **({"instructions": cfg.instructions} if cfg.distill and not cfg.distill_prompts else {}),
                     "distill_tokens": cfg.distill_tokens, "epochs": cfg.epochs, **({"init": cfg.init} if cfg.init else {}),
                     "cpu_seconds_wall": round(seconds, 1), "machine": {k: v for k, v in environment().items()
                                                                        if k != "versions"}},
        "versions": environment()["versions"],
    }
