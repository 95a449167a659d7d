"""Train an EAGLE head on a frozen target's cached features.

Row i of a sequence is (f_i, token i+1) and learns f_{i+1} (smooth L1, EAGLE's regression)
and the target's own prediction at i+1 (cross-entropy through the target's LM head, restricted
to the most frequent `vocab_subset` labels as for Medusa). Input features get EAGLE's uniform
noise, so the head tolerates imperfect features. Drafting token 2 onwards feeds the head its
own guesses, which teacher forcing never shows it (measured: after 10 epochs on SmolLM2, draft
token 1 right 32% of the time, tokens 1-2 both right 2%), so each batch is also run `unroll`
more times with every row's feature replaced by the previous pass's guess of it (a cheap form
of EAGLE-3's training-time test). Only rows whose label lies in the answer part of a distilled
sequence count; the prompt is context.

Held-out accuracy is measured by the proposer's own drafting (specpipe/train/drafting.py):
position k's figure is P(draft tokens 1..k all equal the target's).
"""

from __future__ import annotations

import torch
from torch import nn

from specpipe.heads.eagle import EagleHead
from specpipe.train import drafting
from specpipe.train.drafting import FrozenTarget


class Rows:
    """Cached sequences as training rows, batched by padding similar lengths together."""

    next_features = True  # EAGLE regresses f_{i+1}; EAGLE-3's rows go without it

    def __init__(self, seqs: list[dict]):
        self.seqs = [s for s in seqs if len(s["tokens"]) >= 3]

    def __len__(self) -> int:
        return sum(len(s["tokens"]) - 1 for s in self.seqs)

    def batches(self, tokens_per_batch: int, generator: torch.Generator) -> list[list[int]]:
        """Sequence indices per batch: shuffled, then grouped by length (little padding)."""
        order = torch.randperm(len(self.seqs), generator=generator).tolist()
        batches, current, size = [], [], 0
        for window in range(0, len(order), 64):  # sort within windows: random yet similar lengths
            for i in sorted(order[window : window + 64], key=lambda i: len(self.seqs[i]["tokens"])):
                current.append(i)
                size += len(self.seqs[i]["tokens"])
                if size >= tokens_per_batch:
                    batches.append(current)
                    current, size = [], 0
        return batches + ([current] if current else [])

    def tensors(self, batch: list[int]) -> dict[str, torch.Tensor]:
        """Padded [B, n-1] rows: features f_i, next tokens, target features f_{i+1}, labels, weights."""
        seqs = [self.seqs[i] for i in batch]
        n = max(len(s["tokens"]) for s in seqs) - 1
        out = {"features": torch.zeros(len(seqs), n, seqs[0]["features"].shape[1]),
               "tokens": torch.zeros(len(seqs), n, dtype=torch.long), "labels": torch.zeros(len(seqs), n, dtype=torch.long),
               "counted": torch.zeros(len(seqs), n, dtype=torch.bool)}
        if self.next_features:
            out["next_features"] = torch.zeros_like(out["features"])
        for b, s in enumerate(seqs):
            m = len(s["tokens"]) - 1
            out["features"][b, :m] = s["features"][:-1].float()
            out["tokens"][b, :m] = s["tokens"][1:].long()
            out["labels"][b, :m] = s["argmax"][1:].long()
            out["counted"][b, max(0, s["start"] - 1) : m] = True  # the label at i+1 is part of the answer
            if self.next_features:
                out["next_features"][b, :m] = s["features"][1:].float()
        return out


class EagleTrainer:
    def __init__(self, head: EagleHead, embed_weight: torch.Tensor, lm_weight: torch.Tensor, subset: torch.Tensor,
                 lr: float, noise: float = 0.2, ce_weight: float = 1.0, unroll: int = 1):
        self.head = head.float().train()
        head.draft_vocab = subset  # it learns to guess these tokens only: drafting scores just their rows
        self.embed_weight = embed_weight.float()  # [V, H] frozen, the target's
        self.lm_weight = lm_weight.float()  # [V, H] frozen, the target's
        self.subset, self.subset_weight = subset, self.lm_weight[subset]  # [V'], [V', H]
        self.to_subset = torch.full((lm_weight.shape[0],), -100, dtype=torch.long)  # label id -> subset column
        self.to_subset[subset] = torch.arange(len(subset))
        self.noise, self.ce_weight, self.unroll = noise, ce_weight, unroll
        self.optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)

    def step(self, rows: Rows, batch: list[int]) -> float:
        t = rows.tensors(batch)
        features = t["features"] + (torch.rand_like(t["features"]) - 0.5) * self.noise  # EAGLE's U(-0.1, 0.1)
        positions = torch.arange(features.shape[1]).expand(features.shape[:2])
        embeds = self.embed_weight[t["tokens"]]
        guessed = self.head(embeds, features, positions)  # [B, n, H]
        loss = self._loss(guessed, t)
        for _ in range(self.unroll):  # row i+1 now reads row i's guess of its feature
            guessed = self.head(embeds, torch.cat([features[:, :1], guessed[:, :-1]], 1), positions)
            loss = loss + self._loss(guessed, t)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.optimizer.step()
        return float(loss.detach())

    def _loss(self, guessed: torch.Tensor, t: dict) -> torch.Tensor:
        counted = t["counted"]
        regression = nn.functional.smooth_l1_loss(guessed[counted], t["next_features"][counted])
        labels = self.to_subset[t["labels"][counted]]
        ce = nn.functional.cross_entropy(guessed[counted] @ self.subset_weight.T, labels, ignore_index=-100)
        return regression + self.ce_weight * ce

    def accuracy(self, rows: Rows, depth: int = 4, per_sequence: int = 8) -> list[float]:
        """Per draft position k: P(the first k guesses all equal the target's greedy tokens),
        drafted by proposer=eagle's own code (specpipe/train/drafting.py)."""
        from specpipe.proposers.eagle import EagleProposer
        from specpipe.sampling import SamplingParams

        proposer = EagleProposer(self.head, SamplingParams())
        return drafting.accuracy(proposer, FrozenTarget(self.embed_weight, self.lm_weight), rows.seqs,
                                 [self.head.shape.hidden_size], depth, per_sequence)


def _trainer(module, weights, train: Rows, cfg) -> EagleTrainer:
    from specpipe.train.features import frequent_labels

    labels = frequent_labels(torch.cat([s["argmax"] for s in train.seqs]), cfg.vocab_subset)
    return EagleTrainer(module, weights.embed, weights.lm, labels, cfg.lr, unroll=cfg.unroll)


def _kind():
    from specpipe.heads.eagle import EagleShape
    from specpipe.heads.io import load_eagle, save_eagle
    from specpipe.train.kind import Kind

    return Kind(fresh=lambda cfg, config, lm, seqs: EagleHead(EagleShape.of_target(config, cfg.intermediate_size or None)),
                load=load_eagle, save=save_eagle, data=lambda seqs, cfg: Rows(seqs), trainer=_trainer,
                figure="held_out_top1_per_position")  # draft tokens 1..k all right, drafted as the proposer does


KIND = _kind()
