"""`Parts`: what a decode step needs, as one typed value (the target's runner, the proposer, the
verifier, the γ controller, the context budget, the text side), and the step's questions to them
that need several at once: each row's γ, what the proposer sees, the draft fitted to the room.
`Pipeline.parts()` makes one; decode/step.py is the step over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specpipe.context import Budget, trimmed
from specpipe.controllers.base import Controller
from specpipe.declaration import batch_refusal as refusal
from specpipe.decode.request import Row
from specpipe.drafts import DraftBatch
from specpipe.engine import Runner
from specpipe.proposers.base import Proposer
from specpipe.sampling import StepRandom
from specpipe.types import Rows
from specpipe.verifiers.base import Verifier


@dataclass(frozen=True)
class Parts:
    runner: Runner  # the target's
    proposer: Proposer | None  # None: plain decoding (γ = 0 every step)
    verifier: Verifier
    controller: Controller | None  # None where there is no proposer
    budget: Budget  # what a row may hold
    tokenizer: object  # the target's: stop strings and incremental text
    eos_ids: tuple[int, ...] | list[int]
    encode: Callable[[object], list[int]]  # prompt text or chat messages -> ids (chat template applied)
    hidden: tuple[int, ...] = ()  # the target hidden states the proposer reads (TargetOutput.hidden)
    overlap: str = "auto"  # plain steps queued before the last is read (decode/loop.py)

    @property
    def batch_refusal(self) -> str | None:
        """Why these parts decode a batch one sequence at a time, or None (they batch)."""
        return batch_refusal(self.runner, self.proposer)

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: the target's weights and KV cache, then the proposer's parts."""
        target = self.runner.memory()
        parts = {"target weights": target.weights, "target KV cache": target.cache}
        return {**parts, **(self.proposer.memory() if self.proposer is not None else {})}

    def gammas(self, busy: list[tuple[int, Row]], width: int) -> tuple[int, list[int]]:
        """The step's γ and each row's: a step emits <= γ + 1, and one forward pads every row to
        the widest draft, so the fullest row bounds every row's γ (its block would run past the
        cache; greedy output is unchanged)."""
        speculating = [row for _, row in busy if row.speculative]
        gamma = self.controller.gamma(len(busy)) if speculating else 0
        limit = self.budget.limit()
        widest = gamma if limit is None else limit.tokens - max(len(row.tokens) for _, row in busy)
        gammas = [0] * width
        for slot, row in busy:
            if row.speculative:
                allowed = max(0, min(gamma, row.budget - 1, widest))
                gammas[slot] = self.controller.row_gamma(slot, allowed)
                row.held = allowed > 0 and gammas[slot] == 0
        return max(gammas), gammas

    def view(self, rows: list[Row | None], random: StepRandom) -> Rows:
        """What the proposer sees of the rows this step, with the step's randomness (the
        verifier's too); trees, for any number of rows, where the verifier and the runner take them."""
        trees = self.verifier.verifies_trees and self.runner.trees
        return Rows([row.tokens if row else [] for row in rows], random, self.controller.stop_below,
                    self.runner.device, trees=trees)

    def propose(self, view: Rows, rows: list[Row | None], gammas: list[int]) -> DraftBatch:
        """The proposer's draft; a tree (more nodes than γ) cut to the room its rows have left."""
        draft = self.proposer.propose(view, gammas)
        if draft.tree is None:
            return draft
        return trimmed(draft, [self.budget.room(row.tokens) for row in rows if row is not None])


def batch_refusal(runner: Runner, proposer: Proposer | None) -> str | None:
    """Why a batch on this runner with this proposer runs one sequence at a time, or None (the
    rule is declaration.batch_refusal's: the proposer states its own facts through it)."""
    if runner.max_rows == 1:
        return refusal(target_engine=runner.engine)
    return proposer.batch_refusal if proposer is not None else None
