"""Held-out accuracy of an EAGLE or EAGLE-3 head, drafted by the proposer's own code.

The proposer (specpipe/proposers/eagle.py) is bound to `FrozenTarget`, the part of a runner it
reads (embeddings and LM head, from the target's weights), and prefilled with the cached
features of a held-out sequence's first tokens, as the target's prefill forward would hand
them over; its greedy chain is then compared with the target's own greedy tokens. Position k's
figure is P(draft tokens 1..k all equal the target's): what greedy verification accepts.
"""

from __future__ import annotations

import torch

from specpipe.engine import TargetOutput
from specpipe.sampling import RowRandom
from specpipe.types import Rows


class FrozenTarget:
    """What a head's drafting reads of the target's runner, from its frozen weights."""

    def __init__(self, embed: torch.Tensor, lm: torch.Tensor):
        self.embed_weight, self.lm_weight = embed, lm  # [V, H] float32 each
        self.vocab_size = lm.shape[0]
        self.device = lm.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_weight[ids]

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float() @ self.lm_weight.T

    def lm_head_weight(self) -> torch.Tensor:
        return self.lm_weight


@torch.no_grad()
def accuracy(proposer, target: FrozenTarget, seqs: list[dict], widths: list[int], depth: int = 4,
             per_sequence: int = 8) -> list[float]:
    """Per draft position k: P(the first k drafted tokens all equal the target's greedy ones).

    seqs: cached sequences (features [n, sum(widths)], the proposer's layers side by side;
    tokens; argmax; start); the target's own answers are used when there are any, since their
    text is its greedy continuation (other text diverges from it)."""
    proposer.head.eval()
    proposer.bind(target)
    hits, total = torch.zeros(depth), 0
    for s in [s for s in seqs if s["start"] > 0] or seqs:
        for length in _positions(s, depth, per_sequence):
            hits += _hits(proposer, s, length, widths, depth)
            total += 1
    proposer.head.train()
    return (hits / max(total, 1)).tolist()


def _hits(proposer, s: dict, length: int, widths: list[int], depth: int) -> torch.Tensor:
    """Draft `depth` tokens after s's first `length` tokens, as generation would."""
    tokens = s["tokens"][:length].tolist()
    parts = s["features"][: length - 1].float().split(widths, -1)  # the prefill saw tokens[:-1]
    proposer.prefill(0, tokens, TargetOutput(torch.empty(0), dict(zip(proposer.hidden_layers, (p[None] for p in parts)))))
    rows = Rows([tokens], [RowRandom(0)], lambda position: 0.0, torch.device("cpu"), trees=False)
    drafted = proposer.propose(rows, [depth]).tokens[0].tolist()
    wanted = s["argmax"][length - 1 : length - 1 + depth].tolist()  # the target's greedy tokens there
    hits = torch.zeros(depth)
    for k, (a, b) in enumerate(zip(drafted, wanted)):
        if a != b:
            break
        hits[k] = 1
    return hits


def _positions(s: dict, depth: int, count: int) -> list[int]:
    """Evenly spread lengths inside the answer, leaving room for `depth` target tokens."""
    first, last = max(2, s["start"] + 1), len(s["tokens"]) - depth
    if last <= first:
        return []
    step = max(1, (last - first) // count)
    return list(range(first, last, step))[:count]
