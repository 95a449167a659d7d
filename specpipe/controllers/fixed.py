"""Fixed γ: the same draft length every step."""

from __future__ import annotations

from specpipe.controllers.base import Controller, check_gamma


class FixedGamma(Controller):
    def __init__(self, gamma: int):
        self._gamma = check_gamma(gamma)

    def gamma(self) -> int:
        return self._gamma


def build(*, context, gamma: int) -> FixedGamma:
    return FixedGamma(gamma)
