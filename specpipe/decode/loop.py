"""The decode loop: one, batch-first, for one sequence and for many (a sequence is a batch of one).

A `Decoder` holds `slots` sequences, one per batch row of the target's KV cache (and of a draft
model's), and runs THE step (decode/step.py: launch 1-4, settle 5-7) over its `Parts`. This
module keeps what surrounds the step: admission, overlap and events (8).

Plain decoding overlaps the host with the device: a plain step's input is the previous step's
token, which is on the device already, so the loop queues step N+1 (fed from step N's verdict on
the device) before it reads step N's verdict, and emits step N's tokens while the device runs
N+1 (vLLM's asynchronous scheduling). A row that stops at step N has had step N+1 computed for
nothing, which is dropped. `overlap` (auto: where the device runs asynchronously, CUDA) turns it
on. A speculative step cannot be queued so (the proposer drafts from the tokens the host reads),
but the plain steps of rows the controller holds at γ 0 whatever the step in flight shows (the
guard's pauses, a batch size's schedule at 0: `Controller.holds`) are, so a paused request runs
as fast as plain decoding. With `overlap` on, every step, speculative too, leaves its text and
events (8: the detokenization and the consumer's work) until the next step is queued, so only
what the next step needs (the read, the commits, the controller's update, the stop rules, the
next draft) sits between a speculative step and the next; off (the CPU's default, where the
device is the host and nothing overlaps), each step's events come before the next step.

Rows advance by different amounts (ragged acceptance), so a rollback is a length per row. Every
row has its own stop rule. A request with a seed has randomness of its own (`RowRandom`, seeded
by it), so its row decodes exactly as it would alone (bit for bit in the engine's exact
precisions); the others share the run's stream (`RunRandom`, the decoder's `seed`), one draw
launch per purpose for all of them (vLLM's rule).

A finished row's slot admits the next request at once (continuous batching, in process): its
prompt is prefilled alone into that row while the other rows wait, then it joins the next step.
A forward covers rows 0..k-1 where k is one past the highest busy slot: free slots below it
ride along as one padding token each (dropped again); new requests take the lowest free slot.
A proposer that cannot batch (`Proposer.batch_refusal`) and a runner of one row (hf) run at one
slot: the same loop, one sequence at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from specpipe.decode import step
from specpipe.decode.parts import Parts
from specpipe.decode.request import BatchStep, Kept, Request, RequestEvent, RequestTiming, Row
from specpipe.decode.step import Launched
from specpipe.decode.text import TextStream, is_ids
from specpipe.engine.base import OVERLAP, overlaps
from specpipe.sampling import RowRandom, RunRandom
from specpipe.stopping import StopRule

__all__ = ["BatchStep", "Decoder", "OVERLAP", "Request", "RequestEvent", "RequestTiming", "overlaps"]


class HasParts(Protocol):
    def parts(self, speculative: bool = True) -> Parts: ...


class Decoder:
    def __init__(self, source: Parts | HasParts, slots: int, speculative: bool = True, seed: int = 0):
        """source: the step's `Parts`, or what makes them (a `Pipeline`); slots: the most
        sequences decoding at once (1 where the parts cannot batch: `Parts.batch_refusal`);
        seed: the run's stream, which the requests without a seed of their own draw from."""
        self.random = RunRandom(seed)
        if slots < 1:
            raise ValueError("a batch needs at least one slot")
        self.source = source
        self.parts = parts = source if isinstance(source, Parts) else source.parts(speculative)
        self.proposer, self.runner = parts.proposer, parts.runner
        self.refusal = parts.batch_refusal
        self.slots = slots if self.refusal is None else 1
        self.runner.reserve(self.slots)
        if self.proposer is not None:
            self.proposer.reserve(self.slots)
        self.overlap = overlaps(parts.overlap, self.runner.device)  # plain steps queued before the last is read
        if self.proposer is not None and parts.controller.overlapped != self.overlap:
            # the guard prices the plain steps a pause would run at what they cost: a build gives
            # the controller the overlap at construction; one made by hand before its pipeline's
            # overlap was known (or reused under another) is told here
            parts.controller.overlapped = self.overlap
        self.steps: list[BatchStep] = []
        self._started = time.perf_counter()
        self._since = None  # the last step's clock (its successor's host time counts from its end)

    def memory(self) -> dict[str, int]:
        """The pipeline's bytes (its proposer's too, for a plain run beside it), or these parts'."""
        return self.source.memory() if hasattr(self.source, "memory") else self.parts.memory()

    def run(self, requests: Iterable[Request]) -> Iterator[RequestEvent]:
        """Decode a stream of requests, `slots` at a time; events of all requests, in step order.
        A list of requests is checked against the context before the first is decoded; a stream's
        requests one at a time, as each is admitted (before its prefill)."""
        if isinstance(requests, Sequence):
            self.parts.budget.fit_all([(_name(i), self._ids(r), r.max_new_tokens) for i, r in enumerate(requests)])
        queue = iter(enumerate(requests))
        rows: list[Row | None] = [None] * self.slots
        self.runner.reset()  # an interrupted earlier run may have left rows
        self._started = time.perf_counter()
        self._since = None
        exhausted = False
        pending: Launched | None = None  # a plain step queued on the device, its verdict not read yet
        kept: list[Kept] = []  # the last settled step's rows: overlapped, their events wait for the next launch
        while True:
            if pending is not None and self.proposer is not None and any(row.done for _, row in pending.busy):
                # a finished row's slot takes a new request only once its last step is read: the
                # proposer's commit of that step must come before the new request's prefill
                yield from self._events(kept)
                kept, pending = self._settled(pending, rows), None
            if kept and not exhausted and None in rows:  # a finished request's last event before the next prefill
                yield from self._events(kept)
                kept = []
            while not exhausted and None in rows:
                item = next(queue, None)
                if item is None:
                    exhausted = True
                    break
                slot = rows.index(None)  # the lowest free slot keeps the batch's rows packed
                rows[slot] = self._admit(slot, *item)
            busy = [(slot, row) for slot, row in enumerate(rows) if row is not None]
            if pending is not None and not self._feeds(pending, busy):
                yield from self._events(kept)
                kept, pending = self._settled(pending, rows), None  # rows may finish: admit again first
                continue
            if not busy:
                yield from self._events(kept)
                return
            try:
                launched = self._launch(busy, pending)
            except BaseException:  # (an interrupt, a device error): what was decoded still reaches the consumer
                yield from self._events(kept)
                raise
            # the settled step's text and events (the consumer's work too) while the device runs this one
            yield from self._events(kept)
            earlier, pending = pending, (launched if launched.plain and self.overlap else None)
            kept = []
            if earlier is not None:  # read while `launched` runs: its events need not wait
                kept = self._settled(earlier, rows)
                self.parts.gammas(launched.busy, len(launched.rows))  # the controller's calls for it, after the update
                yield from self._events(kept)
                kept = []
            if pending is None:
                kept = self._settled(launched, rows)
                if not self.overlap:  # a synchronous device has nothing to overlap: no event waits
                    yield from self._events(kept)
                    kept = []
            earlier = launched = None  # settled steps' tensors are freed before the next step allocates

    def _settled(self, launched: Launched, rows: list[Row | None]) -> list[Kept]:
        """A step settled, and the slots of the rows it finished freed (the next admission takes them)."""
        kept = self._settle(launched)
        for one in kept:
            if one.reason is not None:
                rows[one.slot] = None
                self._release(one.slot, one.row)
        return kept

    def _events(self, kept: list[Kept]) -> Iterator[RequestEvent]:
        """A settled step's events: each row's new text (incremental detokenization) and the
        consumer's turn, the host work that can wait until the next step is queued."""
        for one in kept:
            row = one.row
            text = row.text.push(one.tokens, final=one.reason is not None)
            yield RequestEvent(row.index, one.tokens, text, one.gamma, row.stats, row.timing, one.reason, one.held)

    def _feeds(self, pending: Launched, busy: list[tuple[int, Row]]) -> bool:
        """Whether the next step can be queued before `pending`'s verdict is read: no row it
        carries over from `pending` can have run out of tokens there (pending emits one a row; a
        row that stops on a token instead has one step dropped), and it is plain whatever
        `pending` shows: no row speculates, or the controller holds every speculating row (the
        guard's pause, alone or the batch size's; a schedule's γ 0), each carried over (a new
        row's admission comes after the update)."""
        if not busy or any(row.budget < 2 for slot, row in busy if pending.carries(slot, row)):
            return False
        speculating = [(slot, row) for slot, row in busy if row.speculative]
        return not speculating or (all(pending.carries(slot, row) for slot, row in speculating)
                                   and self.parts.controller.holds([slot for slot, _ in speculating], len(busy)))

    def _release(self, slot: int, row: Row) -> None:
        """A free slot below a busy one rides along in every forward: its rows are emptied."""
        self.runner.reset(slot)
        if self.proposer is not None:
            self.proposer.release(slot, row.tokens)
            drafter = getattr(self.proposer, "runner", None)  # a draft model's own cache
            if drafter is not None and drafter.rows > slot:
                drafter.reset(slot)

    def _now(self) -> float:
        return time.perf_counter() - self._started

    def _ids(self, request: Request) -> list[int]:
        return list(request.prompt) if is_ids(request.prompt) else self.parts.encode(request.prompt)

    def _admit(self, slot: int, index: int, request: Request) -> Row:
        parts = self.parts
        timing = RequestTiming(self._now())
        ids = self._ids(request)
        max_new_tokens = parts.budget.fit(ids, request.max_new_tokens, _name(index))
        rule = StopRule(parts.tokenizer, parts.eos_ids, list(request.stop), max_new_tokens)
        speculative = self.proposer is not None and request.speculative
        row = Row(index, list(ids), rule, timing, TextStream(parts.tokenizer), RowRandom(request.seed, run=self.random),
                  speculative)
        started = time.perf_counter()
        self.runner.reset(slot)
        self.runner.expect(slot, len(ids) + max_new_tokens)  # one attention width for all its steps
        hidden = parts.hidden if speculative else ()
        out = self.runner.prefill(slot, ids[:-1], hidden=hidden) if len(ids) > 1 else None
        if speculative:
            self.proposer.prefill(slot, row.tokens, out)
            parts.controller.admit(slot)  # the guard's judgement of this row starts afresh
        row.stats.prefill_s = time.perf_counter() - started
        self._since = None  # a prefill is timed apart, not as the next step's host time
        return row

    def _launch(self, busy: list[tuple[int, Row]], pending: Launched | None = None) -> Launched:
        """Steps 1-4 (decode/step.py), the next step's host time counted from this one's end."""
        launched = step.launch(self.parts, busy, pending, self._since)
        self._since = launched.clock
        return launched

    def _settle(self, launched: Launched) -> list[Kept]:
        """Steps 5-7 (decode/step.py), and the batch's step trace."""
        kept, timing = step.settle(self.parts, launched, self._now)
        if kept:  # (a step whose rows had all stopped before it was read emitted nothing)
            self.steps.append(BatchStep(self._now(), len(kept), launched.gamma, sum(len(k.tokens) for k in kept),
                                        timing.total_s))
        return kept


def _name(index: int) -> str:
    return f"Prompt #{index + 1}"
