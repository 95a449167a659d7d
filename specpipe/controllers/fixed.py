"""Fixed γ: the same draft length every step."""

from __future__ import annotations

from specpipe.controllers.base import Controller, settings


class FixedGamma(Controller):
    adapts = False


def build(*, context, gamma: int, gamma_min: int = 1, gamma_max: int = 8) -> FixedGamma:
    return FixedGamma(gamma, gamma_min, gamma_max, **settings(context))
