"""The frozen target's features over the training text, computed once and cached on disk.

For every token of every sequence: the target's feature (its LM head's input, fp16 on disk)
and the target's own greedy prediction there (int32); per sequence, the first position that
counts (a self-distilled answer's prompt is context, not something to learn or score). Heads
learn to predict the target's predictions (self-distillation on teacher-forced text), so their
guesses are what greedy verification will accept. Shards of `SHARD` sequences are written
atomically and skipped when they hold the same tokens, so an interrupted run resumes; a new
setting (model, text, precision) gets a new folder. A list that only grows (self-distilled
answers: `distill=` counts instructions from a fixed sequence) keeps one folder, so a longer
run reuses a shorter one's shards, and a shard whose sequences changed (an edited request's
new answer) is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specpipe.engine import FINAL, Runner
from specpipe.models.zoo import cache_root

SHARD = 32  # sequences per file


def feature_dir(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    slug = Path(str(key["model"]).rstrip("/")).name
    return cache_root() / "features" / f"{slug}-{digest}"


@torch.inference_mode()
def compute(target: Runner, seqs: list[list[int]], folder: Path, progress: Progress | None = None,
            starts: list[int] | None = None, layers: tuple[int, ...] = (FINAL,)) -> Path:
    """The target's features (its hidden states at the runner keys `layers`, side by side: the
    LM-head input by default) and argmax over each sequence, one forward per sequence on the
    target's runner. starts: per sequence, the first position whose prediction is learned
    (default 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    starts = starts or [0] * len(seqs)
    shards = [(seqs[i : i + SHARD], starts[i : i + SHARD]) for i in range(0, len(seqs), SHARD)]
    task = progress.add_task("target features", total=len(seqs)) if progress else None
    for index, (shard, first) in enumerate(shards):
        path = folder / f"shard-{index:05d}.safetensors"
        if not _holds(path, shard):  # a shorter run's last shard is rewritten when a run grows
            _write_shard(target, shard, first, path, layers)
        if progress:
            progress.advance(task, len(shard))
    return folder


def _holds(path: Path, shard: list[list[int]]) -> bool:
    """Whether the file at `path` holds the features of exactly these sequences."""
    if not path.exists():
        return False
    with safe_open(str(path), "pt") as f:
        lengths, tokens = f.get_tensor("lengths"), f.get_tensor("tokens")
    return lengths.tolist() == [len(ids) for ids in shard] and tokens.tolist() == [t for ids in shard for t in ids]


def _write_shard(target: Runner, shard: list[list[int]], starts: list[int], path: Path,
                 layers: tuple[int, ...]) -> None:
    features, argmax = [], []
    for ids in shard:
        target.reset()
        out = target.forward(torch.tensor([ids]).to(target.device), hidden=layers)
        features.append(torch.cat([out.hidden[key][0] for key in layers], -1).to(torch.float16))  # [n, H * layers]
        argmax.append(out.logits[0].argmax(-1).to(torch.int32))  # [n]
    tensors = {"features": torch.cat(features), "argmax": torch.cat(argmax),
               "lengths": torch.tensor([len(ids) for ids in shard], dtype=torch.int32),
               "starts": torch.tensor(starts, dtype=torch.int32),
               "tokens": torch.tensor([t for ids in shard for t in ids], dtype=torch.int32)}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def frequent_labels(labels: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent target predictions among `labels` (sorted ids): the columns a
    head's cross-entropy scores (and an EAGLE head's draft vocabulary)."""
    counts = torch.bincount(labels.long())
    return counts.topk(min(size, int((counts > 0).sum()))).indices.sort().values


def load(folder: Path, count: int | None = None) -> list[dict]:
    """Per sequence (the first `count`): features [n, H * layers] fp16, argmax [n], tokens [n], start
    (first counted position)."""
    out = []
    for path in sorted(folder.glob("shard-*.safetensors")):
        if count is not None and len(out) >= count:
            break  # a longer run's shards: not this run's sequences
        shard = load_file(str(path))
        offsets = torch.cumsum(shard["lengths"].long(), 0).tolist()
        firsts = shard["starts"].tolist()
        start = 0
        for end, first in zip(offsets, firsts):
            out.append({**{k: shard[k][start:end] for k in ("features", "argmax", "tokens")}, "start": first})
            start = end
    return out[:count]
