"""Heuristic γ (transformers' assisted-generation schedule): +2 after a step whose every draft
token was accepted, -1 otherwise."""

from __future__ import annotations

from specpipe.controllers.base import Controller, settings
from specpipe.types import RowVerdict, StepTiming


class HeuristicGamma(Controller):
    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        for verdict in verdicts:  # each row's step, in turn
            self._learn(verdict)

    def _learn(self, verdict: RowVerdict) -> None:
        if verdict.gamma == 0:
            return
        step = 2 if verdict.n_accepted == verdict.gamma else -1
        self._gamma = self.clamp(self._gamma + step)


def build(*, context, gamma: int, gamma_min: int = 1, gamma_max: int = 8) -> HeuristicGamma:
    return HeuristicGamma(gamma, gamma_min, gamma_max, **settings(context))
