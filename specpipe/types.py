"""The small typed objects passed between the parts of one decode step.

Glossary (DESIGN.md vocabulary): the *target* is the model whose output is preserved; the
*draft* is what a proposer guesses; γ (`gamma`) is the number of draft tokens in a step.
*accepted* draft tokens are kept; the *recovered* token is resampled at the first rejection;
the *bonus* token is the extra target token after all γ were accepted. Every step emits
n_accepted + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftBlock:
    """A chain of γ guessed tokens.

    tokens: [γ] int64. probs: [γ, V] float32 draft distributions the tokens were sampled
    from (after the same temperature/top-k/top-p as the target), or None for a model-free or
    greedy draft, which verifiers treat as one-hot on `tokens` (still lossless).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [γ] the drafter's top probability at each token

    @property
    def gamma(self) -> int:
        return int(self.tokens.numel())

    @staticmethod
    def empty() -> "DraftBlock":
        return DraftBlock(torch.empty(0, dtype=torch.long))


@dataclass(frozen=True)
class Verdict:
    """What one target forward decided about a draft.

    n_accepted: how many leading draft tokens are kept (0..γ). next_token: the recovered token
    (n_accepted < γ) or the bonus token (n_accepted == γ). gamma: the draft length verified.
    """

    n_accepted: int
    next_token: int
    gamma: int
    accepted_tokens: tuple[int, ...] = ()
    confidence: tuple[float, ...] = ()  # the draft's, passed on for controllers that learn from it

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted_tokens, self.next_token]


@dataclass(frozen=True)
class StepTiming:
    """Wall-clock seconds of one step's two phases."""

    propose_s: float
    verify_s: float

    @property
    def total_s(self) -> float:
        return self.propose_s + self.verify_s
