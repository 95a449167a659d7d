"""Confidence-gated drafting: draft up to γ tokens, but stop after a draft token whose top
probability (as the drafter saw it) falls below `threshold`. With `adapt`, the threshold is
re-tuned online: raised toward the confidence of confidently drafted tokens the target
rejected, lowered toward that of doubtful ones it accepted anyway."""

from __future__ import annotations

from specpipe.controllers.base import Controller, settings
from specpipe.errors import SpecpipeError
from specpipe.types import RowVerdict, StepTiming


class ConfidenceGamma(Controller):
    adapts = False  # γ stays; drafts stop early below the threshold

    def __init__(self, gamma: int, gamma_min: int = 1, gamma_max: int = 8, *, threshold: float = 0.4,
                 adapt: bool = True, rate: float = 0.05, **pipeline):
        super().__init__(gamma, gamma_min, gamma_max, **pipeline)
        if not 0.0 <= threshold <= 1.0:
            raise SpecpipeError(f"controller.threshold={threshold} must be a probability in [0, 1].")
        self.threshold, self.adapt, self.rate = threshold, adapt, rate

    def stop_below(self, position: int) -> float:
        return self.threshold if position + 1 >= self.gamma_min else 0.0

    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        for verdict in verdicts:  # each row's step, in turn
            self._learn(verdict)

    def _learn(self, verdict: RowVerdict) -> None:
        if not self.adapt or not verdict.confidence:
            return
        # the tokens the target judged: the accepted ones and the first rejected one
        for i, confidence in enumerate(verdict.confidence[: verdict.n_accepted + 1]):
            accepted = i < verdict.n_accepted
            if accepted and confidence < self.threshold:
                self.threshold -= self.rate * (self.threshold - confidence)  # stopped too early
            elif not accepted and confidence >= self.threshold:
                self.threshold += self.rate * (confidence - self.threshold)  # drafted too far


def build(*, context, gamma: int, gamma_min: int = 1, gamma_max: int = 8, **options) -> ConfidenceGamma:
    return ConfidenceGamma(gamma, gamma_min, gamma_max, **options, **settings(context))
