"""Acceptance band: the rule operators tune by. Over a moving window of steps, acceptance above
`high` (60%) raises γ by one toward `gamma_high`; below `low` (40%) lowers it toward `gamma_low`."""

from __future__ import annotations

from collections import deque

from specpipe.controllers.base import Controller, settings
from specpipe.errors import SpecpipeError
from specpipe.types import RowVerdict, StepTiming


class BandGamma(Controller):
    def __init__(self, gamma: int, gamma_min: int = 1, gamma_max: int = 8, *, low: float = 0.4,
                 high: float = 0.6, gamma_low: int = 2, gamma_high: int = 6, window: int = 8, **pipeline):
        super().__init__(gamma, gamma_min, gamma_max, **pipeline)
        if not 0.0 <= low <= high <= 1.0 or window < 1:
            raise SpecpipeError(
                f"controller.low={low}, controller.high={high}, controller.window={window}: need "
                "0 <= low <= high <= 1 and window >= 1 (e.g. low=0.4 high=0.6 window=8)."
            )
        self.low, self.high = low, high
        self.gamma_low, self.gamma_high = self.clamp(gamma_low), self.clamp(gamma_high)
        self._window: deque[tuple[int, int]] = deque(maxlen=window)  # (accepted, drafted)

    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        for verdict in verdicts:  # each row's step, in turn
            self._learn(verdict)

    def _learn(self, verdict: RowVerdict) -> None:
        if verdict.gamma == 0:
            return
        self._window.append((verdict.n_accepted, verdict.gamma))
        rate = sum(a for a, _ in self._window) / sum(d for _, d in self._window)
        if rate > self.high and self._gamma < self.gamma_high:
            self._gamma += 1
        elif rate < self.low and self._gamma > self.gamma_low:
            self._gamma -= 1


def build(*, context, gamma: int, gamma_min: int = 1, gamma_max: int = 8, **band) -> BandGamma:
    return BandGamma(gamma, gamma_min, gamma_max, **band, **settings(context))
