"""`DraftLM`: a head's token scorer over the target's LM head (all of it, or only the rows of a
draft vocabulary, in the head's precision). EAGLE, EAGLE-3 and DFlash heads draft through it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpipe.engine import Runner
from specpipe.heads.logits import CappedRows, final_softcap
from specpipe.models.quantize import quantize_model


class DraftLM:
    """A head's token scorer: `scores` maps its outputs [..., H] to float32 logits over the
    draft vocabulary `ids` (None: the whole vocabulary). Tokens outside it get -inf: never
    drafted, and verified by the target as always, so nothing is lost but a guess the head
    could not make."""

    def __init__(self, scores: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor | None, vocab_size: int,
                 rows: torch.nn.Module | None = None):
        self.scores, self.ids, self.vocab_size = scores, ids, vocab_size
        self.rows = rows  # weights of its own (the LM-head rows of `target_rows`), for `memory`
        self.size = vocab_size if ids is None else len(ids)  # tokens it can draft

    @classmethod
    def target_rows(cls, target: Runner, ids: torch.Tensor | None, quantize: str = "none") -> "DraftLM":
        """The target's LM head: all of it, or only the rows of `ids`, in the head's precision."""
        if ids is None:
            return cls(target.lm_head, None, target.vocab_size)
        ids = ids.to(target.device)  # a head's draft vocabulary is a plain attribute: `head.to` leaves it behind
        cap = final_softcap(getattr(getattr(target, "model", None), "config", None))  # rows carry no tanh
        rows = CappedRows(_rows_linear(target.lm_head_weight()[ids], quantize), cap)
        return cls(lambda hidden: rows(hidden.float()), ids, target.vocab_size, rows)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> float32 logits [..., V] (a full distribution, for sampling)."""
        sub = self.scores(hidden)  # [..., K]
        if self.ids is None:
            return sub
        logits = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        logits[..., self.ids] = sub
        return logits

    def top(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., H] -> the k best (log-probabilities, token ids) [..., k]. Greedy drafting and
        trees need no more, so a draft vocabulary is never spread over the full vocabulary
        (a scatter, argmax and softmax over 49k entries per draft token on SmolLM2)."""
        best = torch.log_softmax(self.scores(hidden), -1).topk(k)
        return (best.values, best.indices) if self.ids is None else (best.values, self.ids[best.indices])


def _rows_linear(rows: torch.Tensor, quantize: str) -> torch.nn.Module:
    """[K, H] LM-head rows as a Linear H -> K in the `quantize` kernel."""
    linear = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False)
    linear.weight = torch.nn.Parameter(rows, requires_grad=False)
    return quantize_model(torch.nn.Sequential(linear), quantize)[0]
