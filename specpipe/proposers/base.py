"""The proposer interface, batch-first: `prefill(row, prompt, out)`, `fill(rows, gammas)`,
`propose(rows, gammas)`, `commit(verdict, host, out)`.

A proposer guesses; it never decides γ (the controller does) and never decides what is kept
(the verifier does). What it needs of the target it declares (`hidden_layers`: keys of
specpipe/engine/base.py) and receives from the step as a `TargetOutput`, never by hooks.

One interface serves one sequence and many: row b of every call is batch row b of the target's
KV cache (a single sequence is a batch of one). `propose` answers with one `DraftBatch`, chains
or a tree, on the runner's device, or on the host where the host drafted it: a proposer that
drafts row by row (a lookup over the row's text) builds the batch's host tensors from its rows'
token lists (`DraftBatch.of_lists`). One that cannot take several rows in a step says why in
`batch_refusal`, and a batch then runs one sequence at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specpipe.drafts import DraftBatch
from specpipe.engine import Runner, TargetOutput
from specpipe.types import Rows, RowVerdict, Verdict


class Proposer(ABC):
    hidden_layers: tuple[int, ...] = ()  # target hidden states the step must hand over

    @property
    def batch_refusal(self) -> str | None:
        """Why a batch of this proposer must run one sequence at a time, or None (it batches)."""
        return None

    def widest(self, gamma: int, trees: bool) -> int:
        """The most draft tokens a step asked for at most `gamma` may return (trees: whether a
        tree may be; default: a chain of γ)."""
        return gamma

    def bind(self, target: Runner) -> None:
        """The target's runner, once, before any generation (default: not needed)."""

    def reserve(self, rows: int) -> None:
        """Room for `rows` sequences at once (default: nothing to hold)."""

    def prefill(self, row: int, prompt: list[int], out: TargetOutput | None) -> None:
        """A new request in `row`: its prompt, and the target's prefill forward over prompt[:-1]
        (`out`, [1, ...]; None for a one-token prompt). Default: nothing."""

    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """Before a step's draft: bring the own cache of every row about to draft (gammas[b] > 0)
        up to its committed tokens, where it lags (timed apart from the draft: a one-off, see
        StepTiming.fill_s). Default: nothing to fill."""

    @abstractmethod
    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        """Up to gammas[b] draft tokens following rows.tokens[b], for every row b."""

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        """The step's verdict (device tensors and their host copy, one RowVerdict per row) and
        its verify forward; forget whatever followed each row's accepted prefix (default: nothing)."""

    def release(self, row: int, tokens: list[int]) -> None:
        """The request in `row` finished with these tokens (prompt and output). Default: nothing."""

    def memory(self) -> dict[str, int]:
        """Bytes this proposer holds, by part (e.g. {"draft weights": ..., "draft KV cache": ...}).
        Default: nothing (model-free proposers)."""
        return {}


def still_drafting(alive: torch.Tensor, confidence: torch.Tensor, threshold: float, device: torch.device) -> bool:
    """After a draft position: rows whose confidence fell below `threshold` stop (in `alive`, on
    the device). Whether any row drafts on is read back only on the CPU, where reading is free;
    on a GPU every row drafts its γ and the stopped rows' tokens are not counted (no sync)."""
    alive &= ~(confidence < threshold)
    return threshold <= 0 or device.type != "cpu" or bool(alive.any())
