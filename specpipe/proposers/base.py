"""The proposer interface: `prefill(state)`, `propose(state, gamma)`, `commit(verdict)`.

A proposer guesses; it never decides γ (the controller does) and never decides what is kept
(the verifier does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from specpipe.state import DecodeState
from specpipe.types import DraftBlock, Verdict


class Proposer(ABC):
    def prefill(self, state: DecodeState) -> None:
        """Prepare for a new generation of `state`'s prompt (default: nothing)."""

    @abstractmethod
    def propose(self, state: DecodeState, gamma: int) -> DraftBlock:
        """Up to `gamma` draft tokens following `state.tokens`."""

    def commit(self, verdict: Verdict) -> None:
        """Forget whatever followed the accepted prefix (default: nothing)."""
