"""Train Medusa heads on a frozen target's cached features.

Head k at position t sees the target's feature f_t and learns the target's own prediction at
position t+k (the token t+k+1): a cross-entropy over the most frequent `vocab_subset` labels
(the target's LM head rows for them; the full vocabulary would cost 49k-152k columns per head
and token) plus a smooth-L1 pull of the head's output toward f_{t+k}, the feature the target's
LM head turns into that prediction. Held-out top-1 accuracy is measured with the FULL LM head,
per head: what greedy verification would accept.
"""

from __future__ import annotations

import torch
from torch import nn

from specpipe.heads.medusa import MedusaHeads


class Examples:
    """Flat views of cached sequences: feats [T, H] fp16, argmax [T], and per head k the index
    of position t+k in the same sequence (or -1)."""

    def __init__(self, seqs: list[dict], num_heads: int):
        self.feats = torch.cat([s["features"] for s in seqs])
        self.argmax = torch.cat([s["argmax"] for s in seqs]).long()
        lengths = torch.tensor([len(s["argmax"]) for s in seqs])
        ends = torch.cumsum(lengths, 0)
        seq_end = torch.repeat_interleave(ends, lengths)  # [T] end of each position's sequence
        first = torch.repeat_interleave(ends - lengths + torch.tensor([s.get("start", 0) for s in seqs]), lengths)
        positions = torch.arange(len(self.argmax))
        self.ahead = torch.stack([torch.where(positions + k < seq_end, positions + k, -1)
                                  for k in range(1, num_heads + 1)], 1)  # [T, K]
        # positions with at least one label, outside a distilled answer's prompt
        self.positions = positions[(self.ahead[:, 0] >= 0) & (positions >= first)]

    def __len__(self) -> int:
        return len(self.positions)

    def batches(self, size: int, generator: torch.Generator) -> list[torch.Tensor]:
        return list(self.positions[torch.randperm(len(self), generator=generator)].split(size))


class Trainer:
    def __init__(self, heads: MedusaHeads, lm_weight: torch.Tensor, subset: torch.Tensor, lr: float):
        self.heads = heads.float().train()
        self.lm_weight = lm_weight.float()  # [V, H] frozen
        self.subset_weight = self.lm_weight[subset]  # [V', H]
        self.to_subset = torch.full((lm_weight.shape[0],), -100, dtype=torch.long)  # label id -> subset column
        self.to_subset[subset] = torch.arange(len(subset))
        self.optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)

    def step(self, ex: Examples, batch: torch.Tensor) -> float:
        x = ex.feats[batch].float()  # [B, H]
        loss = torch.zeros(())
        for k in range(self.heads.num_heads):
            ahead = ex.ahead[batch, k]  # [B]
            valid = ahead >= 0
            if not valid.any():
                continue
            out = self.heads.blocks[k](x[valid])  # [b, H]
            labels = self.to_subset[ex.argmax[ahead[valid]]]
            ce = nn.functional.cross_entropy(out @ self.subset_weight.T, labels, ignore_index=-100)
            pull = nn.functional.smooth_l1_loss(out, ex.feats[ahead[valid]].float())
            loss = loss + ce + pull
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def accuracy(self, ex: Examples, limit: int = 2048) -> list[float]:
        """Per head: top-1 over the full vocabulary equals the target's prediction."""
        self.heads.eval()
        picks = ex.positions[:limit]
        x = ex.feats[picks].float()
        out = []
        for k in range(self.heads.num_heads):
            ahead = ex.ahead[picks, k]
            valid = ahead >= 0
            guess = torch.cat([(self.heads.blocks[k](chunk) @ self.lm_weight.T).argmax(-1) for chunk in x[valid].split(256)])
            out.append(float((guess == ex.argmax[ahead[valid]]).float().mean()) if valid.any() else 0.0)
        self.heads.train()
        return out


def _trainer(module, weights, train: Examples, cfg) -> Trainer:
    from specpipe.train.features import frequent_labels

    return Trainer(module, weights.lm, frequent_labels(train.argmax, cfg.vocab_subset), cfg.lr)


def _kind():
    from specpipe.heads.io import load_medusa, save_medusa
    from specpipe.train.kind import Kind

    return Kind(fresh=lambda cfg, config, lm, seqs: MedusaHeads(lm.shape[1], lm.shape[0], cfg.num_heads, cfg.layers),
                load=load_medusa, save=save_medusa, data=lambda seqs, cfg: Examples(seqs, cfg.num_heads),
                trainer=_trainer, figure="held_out_top1_per_head")  # each head alone


KIND = _kind()
