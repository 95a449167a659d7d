"""The proposer interface: `prefill(state, out)`, `propose(state, gamma)`, `commit(verdict, out)`.

A proposer guesses; it never decides γ (the controller does) and never decides what is kept
(the verifier does). What it needs of the target it declares (`hidden_layers`: keys of
specpipe/engine/base.py) and receives from the step as a `TargetOutput`, never by hooks.

For a batch (specpipe/batch.py) a proposer hands out a `BatchProposer` (`batched(slots)`): the
same three calls over the sequences of a batch, each in a slot. The default keeps one shallow
copy of the proposer per slot (weights shared, one sequence's state each), which is right for
proposers whose per-sequence state is reset in `prefill`; a proposer whose drafting batches
(a draft model, Medusa's heads) overrides it to draft every row in one forward.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

from specpipe.engine import Runner, TargetOutput
from specpipe.state import DecodeState
from specpipe.types import DraftBlock, Verdict


class Proposer(ABC):
    hidden_layers: tuple[int, ...] = ()  # target hidden states the step must hand over

    @property
    def batch_refusal(self) -> str | None:
        """Why a batch of this proposer must run one sequence at a time, or None (it batches)."""
        return None

    def batched(self, slots: int) -> "BatchProposer":
        """This proposer over a batch of `slots` sequences (see the module docstring)."""
        return PerSlot(self, slots)

    def chains_only(self) -> None:
        """The verifier takes chains only (default: nothing; a proposer whose tree is an option is
        refused with such a verifier by the checks, one that drafts trees itself drafts paths)."""

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


class BatchProposer(ABC):
    """A proposer over the sequences of a batch. Slot b is batch row b of the target's cache;
    `out` of `commit` is the batch's verify forward (row b: slot b)."""

    @abstractmethod
    def prefill(self, slot: int, state: DecodeState, out: TargetOutput | None) -> None:
        """A new sequence in `slot` (its own prefill forward's output, as `Proposer.prefill`)."""

    @abstractmethod
    def propose(self, slots: list[int], states: list[DecodeState], gammas: list[int]) -> list[DraftBlock]:
        """Up to gammas[i] draft tokens for the sequence in slots[i]."""

    @abstractmethod
    def commit(self, slots: list[int], verdicts: list[Verdict], out: TargetOutput) -> None:
        """Each slot's verdict of the step."""

    def memory(self) -> dict[str, int]:
        return {}

    def reset(self) -> None:
        """Forget every slot (a new run; default: nothing, each slot's prefill resets it)."""


class PerSlot(BatchProposer):
    """One shallow copy of a proposer per slot: shared weights, separate sequence state."""

    def __init__(self, proposer: Proposer, slots: int):
        self.proposer = proposer
        self.copies = [copy.copy(proposer) for _ in range(slots)]

    def prefill(self, slot: int, state: DecodeState, out: TargetOutput | None) -> None:
        self.copies[slot].prefill(state, out)

    def propose(self, slots: list[int], states: list[DecodeState], gammas: list[int]) -> list[DraftBlock]:
        return [self.copies[s].propose(state, g) if g > 0 else DraftBlock.empty()
                for s, state, g in zip(slots, states, gammas)]

    def commit(self, slots: list[int], verdicts: list[Verdict], out: TargetOutput) -> None:
        for s, verdict in zip(slots, verdicts):
            self.copies[s].commit(verdict, out.row(s))

    def memory(self) -> dict[str, int]:
        parts: dict[str, int] = {}
        for i, proposer in enumerate(self.copies):  # weights once, per-sequence caches summed
            for part, size in proposer.memory().items():
                parts[part] = parts.get(part, 0) + size if "cache" in part or i == 0 else parts[part]
        return parts
