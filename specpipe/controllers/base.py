"""The controller interface: `gamma() -> int`, `update(verdict, timing)`.

γ logic lives here and only here, never inside a proposer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from specpipe.errors import SpecpipeError
from specpipe.types import StepTiming, Verdict


class Controller(ABC):
    @abstractmethod
    def gamma(self) -> int:
        """Draft tokens to propose in the next step."""

    def update(self, verdict: Verdict, timing: StepTiming) -> None:
        """Learn from the step just taken (default: nothing)."""


def check_gamma(gamma: int, what: str = "gamma") -> int:
    if not isinstance(gamma, int) or gamma < 1:
        raise SpecpipeError(
            f"{what}={gamma!r} is not a positive integer. Speculation needs at least one draft "
            f"token per step: use {what}=1 or more (e.g. gamma=4), or proposer=none for plain decoding."
        )
    return gamma
