"""The proposer interface: `prefill(state, out)`, `propose(state, gamma)`, `commit(verdict, out)`.

A proposer guesses; it never decides γ (the controller does) and never decides what is kept
(the verifier does). What it needs of the target it declares (`hidden_layers`: keys of
specpipe/engine/base.py) and receives from the step as a `TargetOutput`, never by hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from specpipe.engine import Runner, TargetOutput
from specpipe.state import DecodeState
from specpipe.types import DraftBlock, Verdict


class Proposer(ABC):
    hidden_layers: tuple[int, ...] = ()  # target hidden states the step must hand over

    def bind(self, target: Runner) -> None:
        """The target's runner, once, before any generation (default: not needed)."""

    def prefill(self, state: DecodeState, out: TargetOutput | None) -> None:
        """Prepare for a new generation of `state`'s prompt; `out` is the target's prefill
        forward over prompt[:-1] (None for a one-token prompt). Default: nothing."""

    @abstractmethod
    def propose(self, state: DecodeState, gamma: int) -> DraftBlock:
        """Up to `gamma` draft tokens following `state.tokens`."""

    def memory(self) -> dict[str, int]:
        """Bytes this proposer holds, by part (e.g. {"draft weights": ..., "draft KV cache": ...}).
        Default: nothing (model-free proposers)."""
        return {}

    def commit(self, verdict: Verdict, out: TargetOutput) -> None:
        """Forget whatever followed the accepted prefix; `out` is the verify forward (default: nothing)."""
