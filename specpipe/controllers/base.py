"""The controller interface: `gamma() -> int`, `update(verdict, timing)`.

γ logic lives here and only here, never inside a proposer. Every controller is bounded by
`gamma_min` / `gamma_max`; only a controller that can tell speculation does not pay (the cost
model) goes down to γ = 0, which makes the next step a plain decoding step.
"""

from __future__ import annotations

from specpipe.errors import SpecpipeError
from specpipe.types import StepTiming, Verdict


class Controller:
    def __init__(self, gamma: int, gamma_min: int = 1, gamma_max: int = 8):
        check_gamma(gamma)
        if not 0 <= gamma_min <= gamma_max:
            raise SpecpipeError(
                f"gamma_min={gamma_min} and gamma_max={gamma_max} must satisfy 0 <= gamma_min <= "
                "gamma_max (e.g. gamma_min=1 gamma_max=8)."
            )
        self.gamma_min, self.gamma_max = gamma_min, gamma_max
        self._gamma = self.clamp(gamma)

    def clamp(self, gamma: int) -> int:
        return max(self.gamma_min, min(self.gamma_max, gamma))

    def gamma(self) -> int:
        """Draft tokens to propose in the next step."""
        return self._gamma

    def update(self, verdict: Verdict, timing: StepTiming) -> None:
        """Learn from the step just taken (default: nothing)."""

    def early_stop(self, position: int, confidence: float) -> bool:
        """Should a drafter stop after draft token `position`, drafted with this top probability?"""
        return False


def check_gamma(gamma: int, what: str = "gamma") -> int:
    if not isinstance(gamma, int) or gamma < 1:
        raise SpecpipeError(
            f"{what}={gamma!r} is not a positive integer. Speculation needs at least one draft "
            f"token per step: use {what}=1 or more (e.g. gamma=4), or proposer=none for plain decoding."
        )
    return gamma
