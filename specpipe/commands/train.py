"""`specpipe train proposer=medusa|eagle|eagle3|dflash model=...`: heads for a frozen target, shipped as a recipe.

1. Text from offline sources (`sources=[stdlib,docs]`), `tokens=` in all, in `seq_len` pieces,
   and the target's own answers to `distill=` offline instructions (cached, resumable).
2. The target's features over it, computed once and cached (specpipe/train/features.py).
3. Epochs over the cached features (the target never runs again; the learning rate warms up
   briefly, then decays to zero on a cosine over all epochs), a progress bar with the
   loss and the held-out top-1 accuracy per head (Medusa) or per draft position (EAGLE, DFlash); a
   checkpoint after every epoch, written atomically; run the same command again after an
   interruption and it resumes.
4. Output: `<out>/<model>/<proposer>/` (config.json + model.safetensors, in the layout vLLM
   loads) and `<out>/<model>/<proposer>.yaml`, a recipe that uses them. That folder is checked
   writable before anything is computed; if writing fails after training anyway, heads and
   recipe are kept together elsewhere and the error names where (specpipe/outputs.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from specpipe.checks.identity import declared, proposer_kind
from specpipe.checks.validate import non_finite
from specpipe.commands.tune import model_slug
from specpipe.declaration import declared_proposers
from specpipe.engine import FINAL, make_runner, pick_engine
from specpipe.errors import SpecpipeError
from specpipe.limits import integer_problems
from specpipe.markup import esc
from specpipe.models.loader import LoadedModel, load_model, load_tokenizer, resolve
from specpipe.models.linears import bulk_rows
from specpipe.models.quantize import quantize_model
from specpipe.outputs import refuse_replacing, save_or_keep, why, writable_output
from specpipe.paths import looked_at, project_path
from specpipe.prompts import load_prompts
from specpipe.commands.train_recipe import recipe as recipe_of
from specpipe.recipe import write_recipe
from specpipe.train import data, distill, features, requests, self_instruct
from specpipe.train.kind import Kind, kind_in
from specpipe.train.prompts import instructions


@dataclass(frozen=True)
class TargetWeights:
    embed: torch.Tensor  # [V, H] token embeddings, full precision
    lm: torch.Tensor  # [V, H] LM head, full precision
    config: object


def run(cfg: DictConfig) -> int:
    _validate(cfg)
    name = proposer_kind(cfg)
    kind = kind_in(declared(cfg).trainer)
    folder = Path(cfg.out) / model_slug(cfg.model.name)
    checkpoint = folder / f".{name}-checkpoint"
    # heads are written once, at the end: what is there is another run's (maybe the shipped heads)
    refuse_replacing([folder / name, folder / f"{name}.yaml"], cfg.overwrite, "the heads it trains")
    writable_output(folder, f"out={cfg.out}", files=(f"{name}.yaml",), folders=(name,))
    err = Console(stderr=True)
    started = time.perf_counter()
    source = resolve(cfg.model.name)
    if cfg.distill and cfg.instructions in ("self", "mixed") and not cfg.distill_prompts:
        self_instruct.user_turn_prefix(load_tokenizer(source))  # refused now: no chat template, no requests
    weights = _target_weights(source)
    cached = _features(cfg, source, kind.layers(cfg, weights.config), err)
    split = max(1, int(len(cached) * cfg.held_out))
    train, held = kind.data(cached[:-split], cfg), kind.data(cached[-split:], cfg)
    module, first_epoch = _start(cfg, kind, weights, cached[:-split], checkpoint, err)
    trainer = kind.trainer(module, weights, train, cfg)
    if first_epoch and (checkpoint / "trainer.pt").exists():
        trainer.optimizer.load_state_dict(torch.load(checkpoint / "trainer.pt")["optimizer"])
    accuracy = _epochs(cfg, kind, module, trainer, train, held, first_epoch, checkpoint, err)
    stored = module.to(getattr(torch, cfg.dtype))  # float16 halves a head's file (the 50 MB budget of recipes/)
    recipe = recipe_of(cfg, name, {kind.figure: accuracy}, len(train), time.perf_counter() - started)

    def write(to: Path) -> Path:  # heads and their recipe stay together: its artifact path is relative
        kind.save(stored, to / name, target=cfg.model.name, extra={"held_out_top1": accuracy}, **kind.save_options(cfg))
        return write_recipe(to / f"{name}.yaml", recipe)

    path = save_or_keep(write, folder, "the trained heads and their recipe")
    shutil.rmtree(checkpoint, ignore_errors=True)  # saved where asked: nothing left to resume
    err.print(f"heads: {esc(path.parent / name)}\nrecipe: {esc(path)}  (use it: specpipe generate recipe={esc(path)})")
    return 0


def _features(cfg: DictConfig, source, layers: tuple[int, ...], err: Console) -> list[dict]:
    """The target's features (at the runner's hidden-state keys `layers`, side by side) over
    corpus text and its own answers: computed once, cached.

    The two parts have their own folders: a run with more `distill=` answers reuses the corpus
    features whole and the answers' earlier shards (the instructions are a fixed sequence)."""
    tokenizer = load_tokenizer(source)
    model = quantize_model(load_model(source), cfg.model.quantize)  # distillation decodes with transformers
    engine = pick_engine(model, cfg.engine, cfg.model.quantize)
    target = {"format": 4, "model": cfg.model.name, "quantize": cfg.model.quantize,
              **({"engine": engine} if engine != "hf" else {}),  # hf: the key older caches were written with
              **({"layers": list(layers)} if layers != (FINAL,) else {})}  # likewise FINAL alone
    with bulk_rows():  # training text: no row of it is compared with a one-token row (quantize.bulk_rows)
        return _computed(cfg, source, model, tokenizer, engine, target, layers, err)


def _computed(cfg: DictConfig, source, model, tokenizer, engine: str, target: dict, layers: tuple[int, ...],
              err: Console) -> list[dict]:
    """`_features`' work: the corpus part and the answers part, each computed or read back."""
    parts = []
    if cfg.tokens:
        seqs = data.sequences(tokenizer, list(cfg.sources), cfg.seq_len, cfg.tokens)
        key = {**target, "sources": list(cfg.sources), "seq_len": cfg.seq_len, "tokens": cfg.tokens}
        parts.append((key, seqs, [0] * len(seqs)))
    if cfg.distill:
        answers = _distilled(cfg, model, tokenizer, engine, err)
        key = {**target, "distill_prompts": cfg.distill_prompts, "distill_tokens": cfg.distill_tokens,
               "seed": cfg.seed, **({"instructions": cfg.instructions} if cfg.instructions != "templates" else {})}
        parts.append((key, [ids for ids, _ in answers], [start for _, start in answers]))
    out = []
    longest = max(len(ids) for _, seqs, _ in parts for ids in seqs)
    # the native engine reads the (packed) weights back at the same precision: the same values
    runner = OnFirstUse(lambda: make_runner(model, engine=engine, precision=cfg.model.quantize, cache_len=longest))
    with _progress(err) as progress:
        for key, seqs, starts in parts:
            folder = features.compute(runner, seqs, features.feature_dir(key), progress, starts, layers)
            out += features.load(folder, len(seqs))
    return out


def _distilled(cfg: DictConfig, model, tokenizer, engine: str, err: Console) -> list[tuple[list[int], int]]:
    """The target's answers to `distill` prompts (cached: a longer run reuses a shorter one's),
    decoded in batches on the target's engine."""
    if cfg.distill_prompts:
        prompts = [p["messages"][-1]["content"] for p in load_prompts(cfg.distill_prompts)][: cfg.distill]
    else:
        prompts = _instructions(cfg, model, tokenizer, engine, err)
    key = {"model": cfg.model.name, "quantize": cfg.model.quantize, "prompts": cfg.distill_prompts or _source(cfg),
           "seed": cfg.seed, "tokens": cfg.distill_tokens}
    decode = None
    if engine == "native":  # its answers may differ from transformers' in the last bits: a cache of their own
        key["engine"] = "native"
        decode = OnFirstUse(lambda: distill.batched_decoder(
            make_runner(model, engine="native", precision=cfg.model.quantize), model, tokenizer, cfg.distill_batch))
    with _progress(err) as progress:
        task = progress.add_task("self-distillation", total=len(prompts))
        started = time.perf_counter()
        out = distill.answers(model, tokenizer, prompts, cfg.distill_tokens, distill.cache_file(key),
                              batch=max(cfg.distill_batch * 2, 32) if decode else 32,
                              on_batch=lambda n: progress.advance(task, n), decode=decode)
    err.print(f"self-distillation: {len(prompts)} answers in {time.perf_counter() - started:.0f} s "
              f"({engine} engine; answers cached earlier are read back, not decoded)", highlight=False)
    return out


def _source(cfg: DictConfig) -> str:
    """The instructions' name in cache keys ("instructions": the templates, the key caches had before).
    The written requests' banks grow and may be edited, so no key names a file's content: the
    answers' cache checks each request's text and the features' each answer's tokens (keys named
    the file's digest before: one new request had every answer decoded again)."""
    return "instructions" if cfg.instructions == "templates" else f"instructions-{cfg.instructions}"


def _instructions(cfg: DictConfig, model, tokenizer, engine: str, err: Console) -> list[str]:
    """`distill` offline instructions: the templates', the target's own (self), or the two in turn
    (mixed: templated ones at even indices). Each is a fixed sequence, so a longer run extends a
    shorter one's list and reuses its answers."""
    if cfg.instructions == "templates":
        return instructions(cfg.distill, cfg.seed)
    if cfg.instructions == "requests":
        return requests.instructions(cfg.distill, cfg.seed)
    own = cfg.distill if cfg.instructions == "self" else cfg.distill // 2
    prefix = self_instruct.user_turn_prefix(tokenizer)  # refuses a tokenizer without a chat template
    key = {"model": cfg.model.name, "quantize": cfg.model.quantize, "seed": cfg.seed, "engine": engine,
           "prefix": prefix, "version": 1}
    sample = OnFirstUse(lambda: self_instruct.sample_rows(
        make_runner(model, engine=engine, precision=cfg.model.quantize), LoadedModel("self-instruct", model, tokenizer),
        cfg.distill_batch))
    with _progress(err) as progress:
        task = progress.add_task("self-written instructions", total=own)
        started = time.perf_counter()
        written = self_instruct.instructions(sample, prefix, own, cfg.seed, distill.cache_file(key, "instruct"),
                                             batch=max(cfg.distill_batch * 2, 32),
                                             on_round=lambda n: progress.update(task, completed=n))
    err.print(f"self-written instructions: {own} in {time.perf_counter() - started:.0f} s (sampled earlier ones are "
              "read back)", highlight=False)
    if cfg.instructions == "self":
        return written
    templated = instructions(cfg.distill - own, cfg.seed)
    return [x for pair in zip(templated, written) for x in pair] + templated[len(written):]


class OnFirstUse:
    """A runner (or decoder) built the first time it is used: with every answer and feature
    shard cached, none is (building the 1.5B's native runner packs 3 GB of weights, ~1 min)."""

    def __init__(self, make):
        self._make, self._made = make, None

    def _get(self):
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getattr__(self, name: str):
        return getattr(self._get(), name)

    def __call__(self, *args, **kwargs):
        return self._get()(*args, **kwargs)


def _validate(cfg: DictConfig) -> None:
    kind = proposer_kind(cfg)
    if cfg.dtype not in ("float32", "float16", "bfloat16"):
        raise SpecpipeError(f"dtype={cfg.dtype}: heads are stored as float32, float16 or bfloat16.")
    if declared(cfg).trainer is None:
        raise SpecpipeError(f"specpipe train proposer={kind}: it has nothing to train (its module declares no "
                            f"trainer; the trained proposers are {', '.join(n for n, d in declared_proposers().items() if d.trainer)}). Draft models come "
                            "trained, twins are the target, and lookup proposers read the prompt.")
    if non_finite(cfg) or integer_problems(cfg):
        raise SpecpipeError(f"{'; '.join(non_finite(cfg) + integer_problems(cfg))}: give every number a finite value "
                            "in its range.")
    at_least = {"num_heads": 1, "layers": 1, "epochs": 1, "batch": 1, "seq_len": 2, "unroll": 0, "ttt": 1, "distill": 0,
                "distill_tokens": 1, "distill_batch": 1, "vocab_subset": 1, "intermediate_size": 0, "tokens": 0}
    wrong = [f"{key}={cfg[key]} must be at least {bound}" for key, bound in at_least.items() if cfg[key] < bound]
    wrong += [f"held_out={cfg.held_out} must be between 0 and 1 (a share)"] if not 0 < cfg.held_out < 1 else []
    wrong += [f"lr={cfg.lr} must be positive"] if not cfg.lr > 0 else []
    if wrong:  # only the settings that are wrong: a valid one named beside them reads as wrong too
        raise SpecpipeError(f"train settings out of range: {'; '.join(wrong)}. Fix those values (see conf/train.yaml "
                            "for the defaults).")
    if cfg.init and not (Path(cfg.init) / "config.json").is_file():
        shipped = project_path(cfg.init)  # `init=recipes/<model>/eagle3` as the docs write it, run anywhere
        if shipped is None or not (shipped / "config.json").is_file():
            raise SpecpipeError(f"init={cfg.init}: no config.json there (looked at {looked_at(cfg.init)}). Point "
                                f"init= at heads a `specpipe train proposer={kind}` run wrote (e.g. "
                                f"recipes/<model>/{kind}), or leave it empty for fresh heads.")
        with open_dict(cfg):
            cfg.init = str(shipped)
    if cfg.instructions not in ("templates", "requests", "self", "mixed"):
        raise SpecpipeError(f"instructions={cfg.instructions}: use templates (train/prompts.py), requests (the "
                            "written requests of prompts/requests*.jsonl, then the templates), self (the target "
                            "writes its own requests, from its chat template) or mixed (templates and self in turn).")
    if cfg.distill_prompts:  # a bad file is refused by its line now, not after the corpus features
        load_prompts(cfg.distill_prompts)
    if not (cfg.tokens >= cfg.seq_len or (cfg.tokens == 0 and cfg.distill > 0)):
        raise SpecpipeError(f"tokens={cfg.tokens} must be at least seq_len={cfg.seq_len} (or tokens=0 with "
                            "distill > 0: the target's answers alone).")


def _target_weights(source) -> TargetWeights:
    """The target's embeddings and LM head in full precision (a packed fp16 module hides its weight)."""
    model = load_model(source)
    return TargetWeights(model.get_input_embeddings().weight.detach().float(),
                         model.get_output_embeddings().weight.detach().float(), model.config)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=False)


def _start(cfg: DictConfig, kind: Kind, weights: TargetWeights, seqs: list[dict], checkpoint: Path, err: Console):
    """A fresh module, or the checkpoint of an interrupted run and its next epoch."""
    state = checkpoint / "trainer.pt"
    if cfg.resume and state.exists():
        saved = torch.load(state)
        if saved["key"] == _run_key(cfg):
            err.print(f"resuming from {esc(checkpoint)} after epoch {saved['epoch'] + 1}")
            return kind.load(checkpoint), saved["epoch"] + 1
    torch.manual_seed(cfg.seed)
    if cfg.init:  # further training of heads trained before (their shape as it is; see Kind.grow)
        err.print(f"starting from the heads in {esc(cfg.init)}")
        return kind.grow(kind.load(Path(cfg.init)).float(), cfg, weights.lm, seqs), 0
    return kind.fresh(cfg, weights.config, weights.lm, seqs), 0


def _run_key(cfg: DictConfig) -> dict:
    return {k: (list(v) if k == "sources" else v) for k, v in
            {"model": cfg.model.name, "proposer": proposer_kind(cfg), "num_heads": cfg.num_heads, "layers": cfg.layers,
             "intermediate_size": cfg.intermediate_size, "unroll": cfg.unroll, "ttt": cfg.ttt,
             "target_layers": list(cfg.target_layers), "vocab_subset": cfg.vocab_subset,
             "sources": cfg.sources, "distill": cfg.distill, "instructions": cfg.instructions,
             "distill_prompts": cfg.distill_prompts, "init": cfg.init,
             "tokens": cfg.tokens, "seq_len": cfg.seq_len, "lr": cfg.lr, "batch": cfg.batch}.items()}


def _epochs(cfg, kind: Kind, module, trainer, train, held, first: int, checkpoint: Path, err) -> list[float]:
    generator = torch.Generator().manual_seed(cfg.seed)
    accuracy = trainer.accuracy(held)
    with _progress(err) as progress:
        for epoch in range(first, cfg.epochs):
            batches = train.batches(cfg.batch, generator)
            task = progress.add_task(f"epoch {epoch + 1}/{cfg.epochs}", total=len(batches))
            losses = []
            for i, batch in enumerate(batches):
                _set_lr(trainer.optimizer, cfg.lr * _cosine((epoch + i / len(batches)) / cfg.epochs))
                losses.append(trainer.step(train, batch))
                progress.update(task, advance=1, description=f"epoch {epoch + 1}/{cfg.epochs} loss "
                                f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
            accuracy = trainer.accuracy(held)
            progress.update(task, description=f"epoch {epoch + 1}/{cfg.epochs} loss {sum(losses) / len(losses):.3f} "
                            f"held-out top-1 per position {' '.join(f'{a:.2f}' for a in accuracy)}")
            _checkpoint(kind, module, trainer, checkpoint, epoch, cfg, err)
    return accuracy


def _cosine(progress: float, warmup: float = 0.02) -> float:
    """The learning rate's factor at `progress` (0 to 1) through training: a short linear warmup,
    then a cosine decay to zero. It is a function of the position alone, so a resumed run picks
    up the schedule where the interrupted one stopped."""
    if progress < warmup:
        return (progress + 1e-3) / warmup
    return 0.5 * (1 + math.cos(math.pi * (progress - warmup) / (1 - warmup)))


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _checkpoint(kind: Kind, module, trainer, folder: Path, epoch: int, cfg: DictConfig, err: Console) -> None:
    """A checkpoint only makes a rerun resume: one that cannot be written stops nothing."""
    tmp = folder / "trainer.pt.tmp"
    try:
        kind.save(module, folder, target=cfg.model.name, **kind.save_options(cfg))
        torch.save({"optimizer": trainer.optimizer.state_dict(), "epoch": epoch, "key": _run_key(cfg)}, tmp)
        os.replace(tmp, folder / "trainer.pt")
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()  # never a stray half checkpoint
        err.print(f"[yellow]warning:[/yellow] no checkpoint after epoch {epoch + 1} ({esc(why(folder, exc))}): "
                  "training goes on, but an interruption now would start over", highlight=False)
