"""`specpipe train proposer=medusa model=...`: heads for a frozen target, shipped as a recipe.

1. Text from offline sources (`sources=[stdlib,docs]`), `tokens=` in all, in `seq_len` pieces.
2. The target's features over it, computed once and cached (specpipe/train/features.py).
3. Epochs over the cached features (the target never runs again), a progress bar with the
   loss and the held-out top-1 accuracy of each head; a checkpoint after every epoch, written
   atomically; run the same command again after an interruption and it resumes.
4. Output: `<out>/<model>/medusa/` (config.json + model.safetensors, vLLM's Medusa layout) and
   `<out>/<model>/medusa.yaml`, a recipe that uses them: `specpipe generate recipe=...`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from specpipe.bench.results import environment, now
from specpipe.checks import proposer_kind
from specpipe.commands.tune import model_slug
from specpipe.errors import SpecpipeError
from specpipe.heads.io import load_medusa, save_medusa
from specpipe.heads.medusa import MedusaHeads
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.models.quantize import quantize_model
from specpipe.recipe import RECIPE_VERSION, write_recipe
from specpipe.train import data, distill, features
from specpipe.train.prompts import instructions
from specpipe.train.medusa import Examples, Trainer, label_subset

TRAINABLE = ("medusa",)


def run(cfg: DictConfig) -> int:
    _validate(cfg)
    folder = Path(cfg.out) / model_slug(cfg.model.name)
    heads_dir, checkpoint = folder / "medusa", folder / ".medusa-checkpoint"
    err = Console(stderr=True)
    started = time.perf_counter()
    source = resolve(cfg.model.name)
    tokenizer = load_tokenizer(source)
    seqs = data.sequences(tokenizer, list(cfg.sources), cfg.seq_len, cfg.tokens) if cfg.tokens else []
    starts = [0] * len(seqs)
    key = {"format": 2, "model": cfg.model.name, "quantize": cfg.model.quantize, "sources": list(cfg.sources),
           "seq_len": cfg.seq_len, "tokens": cfg.tokens, "distill": cfg.distill,
           "distill_prompts": cfg.distill_prompts, "distill_tokens": cfg.distill_tokens}
    model = quantize_model(load_model(source), cfg.model.quantize)
    if cfg.distill:
        for ids, start in _distilled(cfg, model, tokenizer, err):
            seqs.append(ids)
            starts.append(start)
    lm_weight = _dense_lm_weight(source)
    with _progress(err) as progress:
        cached = features.load(features.compute(model, seqs, features.feature_dir(key), progress, starts))
    del model
    split = max(1, int(len(cached) * cfg.held_out))
    train, held = Examples(cached[:-split], cfg.num_heads), Examples(cached[-split:], cfg.num_heads)
    heads, first_epoch = _start(cfg, lm_weight, checkpoint, err)
    trainer = Trainer(heads, lm_weight, label_subset(train, cfg.vocab_subset), cfg.lr)
    if first_epoch and (checkpoint / "trainer.pt").exists():
        trainer.optimizer.load_state_dict(torch.load(checkpoint / "trainer.pt")["optimizer"])
    accuracy = _epochs(cfg, trainer, train, held, first_epoch, checkpoint, err)
    save_medusa(heads, heads_dir, target=cfg.model.name, extra={"held_out_top1": accuracy})
    shutil.rmtree(checkpoint, ignore_errors=True)  # finished: nothing left to resume
    recipe = write_recipe(folder / "medusa.yaml", _recipe(cfg, accuracy, len(train), time.perf_counter() - started))
    err.print(f"heads: {heads_dir}\nrecipe: {recipe}  (use it: specpipe generate recipe={recipe})")
    return 0


def _distilled(cfg: DictConfig, model, tokenizer, err: Console) -> list[tuple[list[int], int]]:
    """The target's answers to `distill` prompts (cached: a longer run reuses a shorter one's)."""
    if cfg.distill_prompts:
        from specpipe.prompts import load_prompts

        prompts = [p["messages"][-1]["content"] for p in load_prompts(cfg.distill_prompts)][: cfg.distill]
    else:
        prompts = instructions(cfg.distill, cfg.seed)
    key = {"model": cfg.model.name, "quantize": cfg.model.quantize, "prompts": cfg.distill_prompts or "instructions",
           "seed": cfg.seed, "tokens": cfg.distill_tokens}
    with _progress(err) as progress:
        task = progress.add_task("self-distillation", total=len(prompts))
        return distill.answers(model, tokenizer, prompts, cfg.distill_tokens, distill.cache_file(key),
                               on_batch=lambda n: progress.advance(task, n))


def _validate(cfg: DictConfig) -> None:
    kind = proposer_kind(cfg)
    if kind not in TRAINABLE:
        raise SpecpipeError(f"specpipe train proposer={kind}: only {', '.join(TRAINABLE)} heads can be trained "
                            "here (EAGLE training is not built yet).")
    if (cfg.num_heads < 1 or cfg.layers < 1 or cfg.epochs < 1 or not 0 < cfg.held_out < 1
            or not (cfg.tokens >= cfg.seq_len or (cfg.tokens == 0 and cfg.distill > 0))):
        raise SpecpipeError("train settings out of range: num_heads, layers and epochs >= 1, tokens >= seq_len "
                            "(or tokens=0 with distill > 0), "
                            f"0 < held_out < 1 (got num_heads={cfg.num_heads} layers={cfg.layers} tokens={cfg.tokens} "
                            f"seq_len={cfg.seq_len} epochs={cfg.epochs} held_out={cfg.held_out}).")


def _dense_lm_weight(source) -> torch.Tensor:
    """The target's LM head in full precision (the packed fp16 module hides its weight)."""
    return load_model(source).get_output_embeddings().weight.detach().float()


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=False)


def _start(cfg: DictConfig, lm_weight: torch.Tensor, checkpoint: Path, err: Console) -> tuple[MedusaHeads, int]:
    """Fresh zero-initialised heads, or the checkpoint of an interrupted run and its next epoch."""
    state = checkpoint / "trainer.pt"
    if cfg.resume and state.exists():
        saved = torch.load(state)
        if saved["key"] == _run_key(cfg):
            err.print(f"resuming from {checkpoint} after epoch {saved['epoch'] + 1}")
            return load_medusa(checkpoint), saved["epoch"] + 1
    torch.manual_seed(cfg.seed)
    return MedusaHeads(lm_weight.shape[1], lm_weight.shape[0], cfg.num_heads, cfg.layers), 0


def _run_key(cfg: DictConfig) -> dict:
    return {k: (list(v) if k == "sources" else v) for k, v in
            {"model": cfg.model.name, "num_heads": cfg.num_heads, "layers": cfg.layers, "sources": cfg.sources,
             "tokens": cfg.tokens, "seq_len": cfg.seq_len, "lr": cfg.lr, "batch": cfg.batch}.items()}


def _epochs(cfg, trainer: Trainer, train: Examples, held: Examples, first: int, checkpoint: Path, err) -> list[float]:
    generator = torch.Generator().manual_seed(cfg.seed)
    accuracy = trainer.accuracy(held)
    with _progress(err) as progress:
        for epoch in range(first, cfg.epochs):
            order = train.positions[torch.randperm(len(train), generator=generator)]
            batches = order.split(cfg.batch)
            task = progress.add_task(f"epoch {epoch + 1}/{cfg.epochs}", total=len(batches))
            losses = []
            for batch in batches:
                losses.append(trainer.step(train, batch))
                progress.update(task, advance=1, description=f"epoch {epoch + 1}/{cfg.epochs} loss "
                                f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
            accuracy = trainer.accuracy(held)
            progress.update(task, description=f"epoch {epoch + 1}/{cfg.epochs} loss {sum(losses) / len(losses):.3f} "
                            f"held-out top-1 per head {' '.join(f'{a:.2f}' for a in accuracy)}")
            _checkpoint(trainer, checkpoint, epoch, cfg)
    return accuracy


def _checkpoint(trainer: Trainer, folder: Path, epoch: int, cfg: DictConfig) -> None:
    save_medusa(trainer.heads, folder, target=cfg.model.name)
    tmp = folder / "trainer.pt.tmp"
    torch.save({"optimizer": trainer.optimizer.state_dict(), "epoch": epoch, "key": _run_key(cfg)}, tmp)
    os.replace(tmp, folder / "trainer.pt")


def _recipe(cfg: DictConfig, accuracy: list[float], examples: int, seconds: float) -> dict:
    return {
        "specpipe_recipe": RECIPE_VERSION,
        "about": f"Medusa heads trained by specpipe train, {now()}",
        "target": cfg.model.name,
        "strategy": {"proposer": "medusa", "proposer.heads": "artifact:heads", "verifier": "greedy",
                     "controller": "fixed", "gamma": cfg.num_heads},
        "artifacts": {"heads": "medusa"},
        "measured": {"held_out_top1_per_head": [round(a, 4) for a in accuracy], "train_positions": examples,
                     "tokens": cfg.tokens, "sources": list(cfg.sources), "epochs": cfg.epochs,
                     "cpu_seconds_wall": round(seconds, 1), "machine": {k: v for k, v in environment().items()
                                                                        if k != "versions"}},
        "versions": environment()["versions"],
    }
