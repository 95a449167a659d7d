"""Train a DFlash drafter (specpipe/heads/dflash.py) on a frozen target's cached multi-layer features.

A training block is what drafting fills: at an anchor position a, the token at a and then
`block_size - 1` mask tokens, at positions a..a+block_size-1, attending to the fused target
features of positions 0..a-1 and to each other, with no causal order. That is a draft step's
view: the last committed token has no feature yet (the target has not run on it), the tokens
before it have. Block row k learns the target's own greedy prediction at a+k-1, the token the
target emits k places after a (on its own answers: the answer's token at a+k). Only labels
inside the answer part of a distilled sequence count.

Many blocks of a batch of sequences share one forward: each block's rows see the context before
their own anchor and their own block's rows, nothing else (the block mask of z-lab's and
SpecForge's trainers). Anchors are drawn at random among the answer's positions, afresh each
epoch. Row k's cross-entropy weighs exp(-(k-1)/(block_size/2)) (DFlash's positional decay: a
later draft counts only when every draft before it is accepted).

The drafter stores no embeddings and no LM head: it reads the target's (frozen). Training scores
only the `vocab_subset` most frequent target predictions, as the Medusa and EAGLE-3 trainers do
(SmolLM2's LM head over 49k tokens would be most of a step); drafting scores the whole
vocabulary, and so does the held-out figure: per draft position k, P(the first k drafts all
equal the target's greedy tokens), what greedy verification accepts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from specpipe.errors import SpecpipeError
from specpipe.heads.dflash import DFlashDrafter, DFlashShape, build_target_layer_ids
from specpipe.heads.dflash_format import load_dflash, save_dflash
from specpipe.heads.eagle import EagleShape
from specpipe.heads.io import CONFIG
from specpipe.train.features import frequent_labels

ANCHORS = 16  # blocks drawn per sequence per epoch (fewer in a shorter answer); `batch` counts blocks
HELD_ANCHORS = 8  # blocks per held-out sequence, spread evenly over its answer
TAPS = 4  # target layers read when target_layers= names none (at least one per draft layer)


def first_anchor(seq: dict) -> int:
    """The first position a block may start at: the answer's (a block at the prompt's last token
    drafts the answer's first tokens, as the first step after a prefill does), never position 0
    (a block there has no context)."""
    return max(int(seq["start"]), 1)


class Blocks:
    """Cached sequences (train/features.py) and the anchors of their blocks."""

    def __init__(self, seqs: list[dict], block_size: int):
        self.block_size = block_size
        self.seqs = [s for s in seqs if len(s["tokens"]) > first_anchor(s)]

    def __len__(self) -> int:
        """Positions a block can start at: what the recipe's `train_positions` counts."""
        return sum(len(s["tokens"]) - first_anchor(s) for s in self.seqs)

    def batches(self, size: int, generator: torch.Generator) -> list[list[tuple[int, torch.Tensor]]]:
        """The sequences shuffled, each with its random anchors, about `size` blocks a batch."""
        per = max(1, size // ANCHORS)
        picks = [(i, self._draw(i, generator)) for i in torch.randperm(len(self.seqs), generator=generator).tolist()]
        return [picks[k : k + per] for k in range(0, len(picks), per)]

    def spread(self, i: int, count: int) -> torch.Tensor:
        """Up to `count` anchors [A] spread over sequence i's answer, each with a whole block of labels."""
        lo, hi = first_anchor(self.seqs[i]), len(self.seqs[i]["tokens"]) - self.block_size + 1
        return torch.linspace(lo, hi, count).round().long().unique() if hi >= lo else torch.empty(0, dtype=torch.long)

    def tensors(self, batch: list[tuple[int, torch.Tensor]]) -> dict:
        """features [S, n, F] float32 (zeros past a sequence's end); tokens [S, n]; labels [S, n + W]
        (the target's greedy prediction after each position, -100 outside the answer: room for a
        block past the end); anchors [S, A] (-1: no block there)."""
        seqs = [self.seqs[i] for i, _ in batch]
        n, width = max(len(s["tokens"]) for s in seqs), max(len(a) for _, a in batch)
        features = torch.zeros(len(seqs), n, seqs[0]["features"].shape[1])
        tokens = torch.zeros(len(seqs), n, dtype=torch.long)
        labels = torch.full((len(seqs), n + self.block_size), -100, dtype=torch.long)
        anchors = torch.full((len(seqs), width), -1, dtype=torch.long)
        for b, (s, (_, drawn)) in enumerate(zip(seqs, batch)):
            m, start = len(s["tokens"]), int(s["start"])
            features[b, :m], tokens[b, :m] = s["features"].float(), s["tokens"].long()
            labels[b, start:m] = s["argmax"][start:].long()
            anchors[b, : len(drawn)] = drawn
        return {"features": features, "tokens": tokens, "labels": labels, "anchors": anchors}

    def _draw(self, i: int, generator: torch.Generator) -> torch.Tensor:
        lo = first_anchor(self.seqs[i])
        count = len(self.seqs[i]["tokens"]) - lo
        return (lo + torch.randperm(count, generator=generator)[:ANCHORS]).sort().values


def block_mask(anchors: torch.Tensor, kept: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """[S, A·W, n + A·W] bool: block j's rows see the context before its anchor and block j's
    own rows. A padded block (kept False) sees its own rows only: never a row with nothing to
    attend to (softmax over no key is NaN)."""
    s, a = anchors.shape
    context = (torch.arange(n) < anchors[..., None]) & kept[..., None]  # [S, A, n]
    own = torch.eye(a, dtype=torch.bool).repeat_interleave(width, 1)  # [A, A·W]
    return torch.cat([context, own.expand(s, a, a * width)], -1).repeat_interleave(width, 1)


def context(drafter: DFlashDrafter, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """features [S, n, F] -> every draft layer's keys and values of every position,
    [layers, S, kv heads, n, d] each (the layout ContextCache.view hands the drafter)."""
    s, n, f = features.shape
    keys, values = drafter.context(features.reshape(s * n, f), torch.arange(n).repeat(s))  # [S·n, layers, kv, d]
    return tuple(t.view(s, n, *t.shape[1:]).permute(2, 0, 3, 1, 4) for t in (keys, values))


def block_outputs(drafter: DFlashDrafter, embed_weight: torch.Tensor, t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block of batch `t` (Blocks.tensors) in one forward -> the mask rows' outputs
    [S, A, W - 1, H] and their labels [S, A, W - 1] (-100: not counted)."""
    anchors, width = t["anchors"], drafter.shape.block_size
    s, a = anchors.shape
    kept, start = anchors >= 0, anchors.clamp(min=0)
    positions = start[..., None] + torch.arange(width)  # [S, A, W]: the anchor's token at its own position
    ids = torch.full((s, a, width), drafter.shape.mask_token_id)
    ids[..., 0] = t["tokens"].gather(1, start)
    keys, values = context(drafter, t["features"])
    mask = block_mask(start, kept, t["features"].shape[1], width)
    hidden = drafter(embed_weight[ids].view(s, a * width, -1), positions.view(s, -1), keys, values, mask)
    labels = t["labels"].gather(1, positions[..., :-1].reshape(s, -1)).view(s, a, width - 1)  # row k: label at a+k-1
    return hidden.view(s, a, width, -1)[:, :, 1:], labels.masked_fill(~kept[..., None], -100)


class DFlashTrainer:
    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor, lm_weight: torch.Tensor,
                 columns: torch.Tensor, lr: float):
        """columns [K]: the target ids the training loss scores (sorted)."""
        self.drafter = drafter.float().train()
        self.embed_weight, self.lm_weight = embed_weight.float(), lm_weight.float()  # [V, H] frozen, the target's
        self.columns_weight = self.lm_weight[columns]  # [K, H]
        self.to_column = torch.full((lm_weight.shape[0],), -100, dtype=torch.long)  # target id -> column
        self.to_column[columns] = torch.arange(len(columns))
        width = drafter.shape.block_size
        self.decay = torch.exp(-torch.arange(width - 1) / (width / 2))  # [W - 1]: row k weighs e^(-(k-1)/(W/2))
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=lr, weight_decay=0.0)

    def step(self, blocks: Blocks, batch: list[tuple[int, torch.Tensor]]) -> float:
        loss = self.loss(blocks.tensors(batch))
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.drafter.parameters(), 1.0)
        self.optimizer.step()
        return float(loss.detach())

    def loss(self, t: dict) -> torch.Tensor:
        """The decayed cross-entropy of every counted mask row (see the module docstring)."""
        hidden, labels = block_outputs(self.drafter, self.embed_weight, t)
        wanted = torch.where(labels >= 0, self.to_column[labels.clamp(min=0)], -100)  # [S, A, W - 1]
        scored = wanted >= 0  # the LM head over only these rows: it is most of a step's cost
        if not scored.any():
            return hidden.sum() * 0.0  # nothing to learn here, and still a graph to step through
        logits = self.drafter.scores(hidden[scored] @ self.columns_weight.T)  # [N, K]
        weights = self.decay.expand_as(wanted)[scored]  # [N]
        return (F.cross_entropy(logits, wanted[scored], reduction="none") * weights).sum() / weights.sum()

    @torch.no_grad()
    def accuracy(self, blocks: Blocks) -> list[float]:
        """Per draft position k, P(the first k greedy drafts all equal the target's greedy tokens),
        over HELD_ANCHORS blocks of each held-out sequence, scored on the whole vocabulary."""
        self.drafter.eval()
        hits, total = torch.zeros(self.drafter.shape.block_size - 1), 0
        for i in range(len(blocks.seqs)):
            anchors = blocks.spread(i, HELD_ANCHORS)
            if len(anchors):
                hidden, labels = block_outputs(self.drafter, self.embed_weight, blocks.tensors([(i, anchors)]))
                drafted = self.drafter.scores(hidden @ self.lm_weight.T).argmax(-1)  # [1, A, W - 1]
                hits += (drafted == labels).long().cumprod(-1).sum((0, 1))  # a draft counts after right ones only
                total += len(anchors)
        self.drafter.train()
        return (hits / max(total, 1)).tolist()


def target_layer_ids(cfg, config) -> tuple[int, ...]:
    """The target layers whose outputs the drafter reads (z-lab's ids: k is the output of layer
    k, the runner's key k): `target_layers=`, else TAPS of them (one per draft layer if more)
    spread as z-lab spreads them, folded into range for targets of few layers."""
    count = config.num_hidden_layers
    ids = tuple(cfg.target_layers) or tuple(sorted({min(max(k, 0), count - 1) for k in
                                                     build_target_layer_ids(count, max(cfg.layers, TAPS))}))
    if not all(0 <= k < count for k in ids) or len(set(ids)) != len(ids):
        raise SpecpipeError(f"target_layers={list(ids)}: a DFlash drafter reads the outputs of distinct target layers, "
                            f"numbered 0 to {count - 1} for this {count}-layer target. Nothing was computed: pass "
                            f"distinct ids in that range, or leave target_layers empty for {TAPS} spread over it.")
    return ids


def fresh_drafter(cfg, config) -> DFlashDrafter:
    """A new drafter of `layers` layers shaped as the target's own (a smaller MLP if asked), drafting
    `num_heads` tokens a block. Its mask token is the vocabulary's last row: BPE vocabularies end
    with their rarest merges (or with padding rows no text holds), so the anchor's token is
    seldom the mask's, and the target's embeddings stay as they are."""
    layer = EagleShape.of_target(config, cfg.intermediate_size or None)
    shape = DFlashShape(layer, cfg.layers, target_layer_ids(cfg, config), cfg.num_heads + 1, config.vocab_size - 1)
    drafter = DFlashDrafter(shape)
    drafter.num_target_layers = config.num_hidden_layers  # its config.json records it (z-lab's format)
    return drafter


def save(drafter: DFlashDrafter, folder: Path, *, target: str, extra: dict | None = None) -> Path:
    """z-lab's format (specpipe/heads/dflash_format.py), plus a `specpipe` entry naming the target
    it was trained on and its held-out figures."""
    folder = save_dflash(drafter, folder, drafter.num_target_layers)
    config = json.loads((folder / CONFIG).read_text())
    config["specpipe"] = {"kind": "dflash", "target": target, **(extra or {})}
    tmp = folder / f"{CONFIG}.tmp"
    tmp.write_text(json.dumps(config, indent=1) + "\n")
    os.replace(tmp, folder / CONFIG)
    return folder


def load(folder: Path) -> DFlashDrafter:
    drafter = load_dflash(folder)
    drafter.num_target_layers = int(json.loads((Path(folder) / CONFIG).read_text())["num_target_layers"])
    return drafter


def _trainer(drafter: DFlashDrafter, weights, train: Blocks, cfg) -> DFlashTrainer:
    shape, ids = drafter.shape, target_layer_ids(cfg, weights.config)
    if (shape.target_layer_ids, shape.block_size) != (ids, cfg.num_heads + 1):  # init= drafters read what they read
        raise SpecpipeError(f"init={cfg.init}: that drafter reads target layers {list(shape.target_layer_ids)} in "
                            f"blocks of {shape.block_size}, and this run's are {list(ids)} and {cfg.num_heads + 1}: pass "
                            f"target_layers={list(shape.target_layer_ids)} num_heads={shape.block_size - 1}.")
    if not len(train):
        raise SpecpipeError("No training sequence has a position to start a block at (each needs a token after its "
                            "prompt): give it text (tokens=) or answers (distill=).")
    answers = torch.cat([s["argmax"][int(s["start"]):] for s in train.seqs])
    return DFlashTrainer(drafter, weights.embed, weights.lm, frequent_labels(answers, cfg.vocab_subset), cfg.lr)


def _kind():
    from specpipe.train.kind import Kind

    return Kind(fresh=lambda cfg, config, lm, seqs: fresh_drafter(cfg, config), load=load, save=save,
                data=lambda seqs, cfg: Blocks(seqs, cfg.num_heads + 1), trainer=_trainer,
                figure="held_out_top1_per_position", layers=target_layer_ids)


KIND = _kind()
