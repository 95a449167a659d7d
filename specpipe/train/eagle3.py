"""Train an EAGLE-3 head on a frozen target's cached multi-layer features, by training-time test.

Row i of a sequence is (fused features at i, token i+1) and learns the target's own prediction
at i+1 (the token i+2): a cross-entropy over the head's draft vocabulary (the `vocab_subset`
most frequent target predictions), nothing else (EAGLE-3 drops EAGLE's feature regression: the
head's output need only serve the next draft step). The training-time test unrolls the head
`ttt` steps as drafting does: at step j row i reads the head's own step j-1 output of row i
with token i+1+j, sits at position i+j, attends to the true rows 0..i (step 0) and to its own
rows of steps 1..j (the draft rows before it in a chain), and learns the target's prediction
at i+1+j; step j's loss weighs 0.8^j (EAGLE-3's). Only labels inside the answer part of a
distilled sequence count.

Held-out accuracy is measured by proposer=eagle3's own drafting (specpipe/train/drafting.py).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import HeadCache
from specpipe.heads.eagle3 import Eagle3Head, Eagle3Shape, default_layers, engine_keys
from specpipe.train import drafting
from specpipe.train.drafting import FrozenTarget
from specpipe.train.eagle import Rows as EagleRows

STEP_WEIGHT = 0.8  # step j's loss weighs STEP_WEIGHT ** j


class Rows(EagleRows):
    """EAGLE's rows (the same batching and padding) without the next-feature targets."""

    next_features = False


def ttt_mask(m: int, step: int) -> torch.Tensor:
    """[1, m, m * (step + 1)] bool: step `step`'s rows over the keys of steps 0..step: row i
    sees rows 0..i of step 0 and row i of each later step (itself at the last)."""
    eye = torch.eye(m, dtype=torch.bool)
    return torch.cat([torch.ones(m, m, dtype=torch.bool).tril(), *[eye] * step], 1)[None]


def shifted(t: torch.Tensor, by: int, fill) -> torch.Tensor:
    """[B, m] -> [B, m], row i holding row i + by (the end filled)."""
    return torch.cat([t[:, by:], t.new_full((t.shape[0], by), fill)], 1) if by else t


class Eagle3Trainer:
    def __init__(self, head: Eagle3Head, embed_weight: torch.Tensor, lm_weight: torch.Tensor, lr: float,
                 ttt: int = 4):
        self.head = head.float().train()
        self.embed_weight, self.lm_weight = embed_weight.float(), lm_weight.float()  # [V, H] frozen, the target's
        self.to_draft = torch.full((lm_weight.shape[0],), -100, dtype=torch.long)  # target id -> draft id
        self.to_draft[head.draft_ids] = torch.arange(head.shape.draft_vocab_size)
        self.ttt = ttt
        self.optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)

    def step(self, rows: Rows, batch: list[int]) -> float:
        t = rows.tensors(batch)
        loss = self.loss(t)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.optimizer.step()
        return float(loss.detach())

    def loss(self, t: dict) -> torch.Tensor:
        """The training-time test's weighted loss over `ttt` steps (see the module docstring)."""
        b, m = t["tokens"].shape
        features, cache, total = self.head.fuse(t["features"]), HeadCache(), 0.0
        labels = torch.where(t["counted"], self.to_draft[t["labels"]], -100)  # [B, m]
        for j in range(self.ttt):
            positions = (torch.arange(m) + j).expand(b, m)
            embeds = self.embed_weight[shifted(t["tokens"], j, 0)]
            features = self.head(embeds, features, positions, ttt_mask(m, j), cache)  # [B, m, H]
            wanted = shifted(labels, j, -100)
            scored = wanted >= 0  # the LM head over only these rows: it is most of a step's cost
            if scored.any():
                ce = nn.functional.cross_entropy(self.head.logits(features[scored]), wanted[scored])
                total = total + STEP_WEIGHT ** j * ce
        return total

    def accuracy(self, rows: Rows, depth: int = 4, per_sequence: int = 8) -> list[float]:
        return held_out(self.head, FrozenTarget(self.embed_weight, self.lm_weight), rows.seqs, depth, per_sequence)


def held_out(head: Eagle3Head, target: FrozenTarget, seqs: list[dict], depth: int = 4,
             per_sequence: int = 8) -> list[float]:
    """Per draft position k, P(head's first k greedy drafts all right) on cached `seqs`, drafted by
    proposer=eagle3's own code (specpipe/train/drafting.py)."""
    from specpipe.proposers.eagle3 import proposer_for  # the proposer imports the heads, not the trainer
    from specpipe.sampling import SamplingParams

    widths = [head.shape.target_hidden_size] * len(head.target_layers)
    return drafting.accuracy(proposer_for(head, SamplingParams()), target, seqs, widths, depth, per_sequence)


def target_layers(cfg, config) -> tuple[int, ...]:
    """The aux layer ids a run trains on: `target_layers=`, else vLLM's default for the target."""
    return tuple(cfg.target_layers) if cfg.target_layers else default_layers(config.num_hidden_layers)


def fresh_head(cfg, config, lm_weight: torch.Tensor, draft_ids: torch.Tensor) -> Eagle3Head:
    """A new head of the target's layer shape; its LM head starts from the target's rows of its
    draft vocabulary, so training refines a working guesser."""
    head = Eagle3Head(Eagle3Shape.of_target(config, len(draft_ids), target_layers(cfg, config),
                                            cfg.intermediate_size or None))
    head.set_vocabulary(draft_ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_weight[draft_ids])
    return head


def grown(head: Eagle3Head, size: int, labels: torch.Tensor, lm_weight: torch.Tensor) -> Eagle3Head:
    """`head` with its draft vocabulary grown to `size` by the most frequent of `labels` [n] it
    lacks: its trained rows kept, each added token's LM-head row the target's (as a fresh head's
    rows start). A head already that large, or labels with nothing new, come back as they are."""
    room = size - head.shape.draft_vocab_size
    counts = torch.bincount(labels.long(), minlength=len(head.t2d))
    counts[head.t2d] = 0  # the tokens it drafts already
    if room <= 0 or not counts.any():
        return head
    added = counts.topk(min(room, int((counts > 0).sum()))).indices
    ids = torch.cat([head.draft_ids, added]).sort().values  # [K'] target ids
    out = Eagle3Head(dataclasses.replace(head.shape, draft_vocab_size=len(ids))).to(head.norm.weight.dtype)
    kept = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = out.load_state_dict(kept, strict=False)
    assert sorted(missing) == ["d2t", "lm_head.weight", "t2d"] and not unexpected, (missing, unexpected)
    out.set_vocabulary(ids)
    with torch.no_grad():
        rows = lm_weight[ids].to(out.lm_head.weight.dtype)  # [K', H]
        rows[torch.searchsorted(ids, head.draft_ids)] = head.lm_head.weight
        out.lm_head.weight.copy_(rows)
    out.embed_tokens = head.embed_tokens
    return out


def _trainer(module, weights, train: Rows, cfg) -> Eagle3Trainer:
    if module.target_layers != target_layers(cfg, weights.config):  # init= heads read other layers
        raise SpecpipeError(f"init={cfg.init}: that head reads target layers {list(module.target_layers)}, and this "
                            f"run's features are of {list(target_layers(cfg, weights.config))}: pass "
                            f"target_layers={list(module.target_layers)}.")
    return Eagle3Trainer(module, weights.embed, weights.lm, cfg.lr, ttt=cfg.ttt)


def _kind():
    from rich.console import Console

    from specpipe.heads.speculators import load_eagle3, save_eagle3
    from specpipe.train.features import frequent_labels
    from specpipe.train.kind import Kind

    def fresh(cfg, config, lm, seqs):
        ids = frequent_labels(torch.cat([s["argmax"] for s in seqs]), cfg.vocab_subset)
        return fresh_head(cfg, config, lm, ids)

    def grow(head, cfg, lm, seqs):
        size = head.shape.draft_vocab_size
        head = grown(head, cfg.vocab_subset, torch.cat([s["argmax"] for s in seqs]), lm)
        if head.shape.draft_vocab_size != size:
            Console(stderr=True).print(f"draft vocabulary grown from {size} to {head.shape.draft_vocab_size} tokens "
                                       f"(vocab_subset={cfg.vocab_subset})")
        return head

    return Kind(fresh=fresh, load=load_eagle3, grow=grow, save=save_eagle3, data=lambda seqs, cfg: Rows(seqs),
                trainer=_trainer,
                figure="held_out_top1_per_position",
                layers=lambda cfg, config: engine_keys(target_layers(cfg, config)),
                # the speculators proposal's speculative_tokens: the steps the head was trained to draft
                save_options=lambda cfg: {"gamma": cfg.ttt})


KIND = _kind()
