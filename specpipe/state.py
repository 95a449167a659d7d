"""`DecodeState`: the committed tokens of one generation and the target's KV cache.

Invariant between steps: the target cache holds every committed token except the last one,
so each step feeds `[last_token, *draft]` and gets γ+1 target distributions from ONE forward:
position i predicts draft token i, position γ predicts the bonus token.
"""

from __future__ import annotations

from typing import Callable

import torch

from specpipe.engine import Runner, TargetOutput
from specpipe.types import Verdict


class DecodeState:
    def __init__(self, target: Runner, prompt_ids: list[int], rng: torch.Generator):
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        self.target = target
        self.tokens: list[int] = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.rng = rng  # the one generator every sampling decision of this generation uses
        # the controller's early-stop rule for drafters: (position, confidence) -> stop?
        self.early_stop: Callable[[int, float], bool] | None = None

    def prefill(self, hidden: tuple[int, ...] = ()) -> TargetOutput | None:
        """Cache prompt[:-1] (None for a one-token prompt: nothing to cache)."""
        self.target.reset()
        if self.prompt_len > 1:
            return self.target.forward(self.tokens[:-1], last_only=True, hidden=hidden)
        return None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def commit(self, verdict: Verdict) -> None:
        """Append the emitted tokens; drop the cache of rejected draft tokens."""
        start = len(self.tokens)  # the cache position of the first accepted draft token
        if verdict.path:  # a tree: the accepted nodes' entries sit at scattered rows of the block
            self.target.keep(start, [start - 1 + row for row in verdict.path])
        self.tokens.extend(verdict.emitted)
        self.target.crop(len(self.tokens) - 1)
