"""Batched speculative decoding with continuous batching: many requests, one decode loop.

A `BatchDecoder` holds `slots` sequences, one per batch row of the target's KV cache (and of a
draft model's). Each step takes one γ for the batch (the controller's, for this batch size),
drafts every row (a row may draft fewer: its budget, or a drafter with nothing to say), verifies
all rows in ONE target forward of [rows, 1 + max γ] (shorter rows right-padded), and lets each
row keep what its own verdict accepted: the rows' caches and positions advance by different
amounts (ragged acceptance), so a rollback is a length per row. Every row has its own stop rule
and its own `torch.Generator`, seeded by its request, so a row decodes exactly as that request
would alone (bit for bit in the engine's exact precisions, see DESIGN.md "Lossless in practice").

A finished row's slot admits the next request at once (continuous batching, in process): its
prompt is prefilled alone into that row while the other rows wait, then it joins the next step.
A forward covers rows 0..k-1 where k is one past the highest busy slot, so free slots below it
ride along as one padding token each (cropped again); new requests take the lowest free slot.

A proposer that cannot batch (`Proposer.batch_refusal`) and a target engine without batch rows
(hf) run at one slot: the same loop, one sequence at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from specpipe.metrics import Stats
from specpipe.context import trimmed
from specpipe.pipeline import TextStream, is_ids
from specpipe.proposers.base import PerSlot
from specpipe.state import DecodeState
from specpipe.stopping import StopRule
from specpipe.types import DraftBlock, DraftTree, StepTiming, Verdict


@dataclass(frozen=True)
class Request:
    prompt: str | list[dict] | list[int]  # text, chat messages, or token ids
    max_new_tokens: int = 128
    seed: int = 0  # of this request's own generator
    stop: tuple[str, ...] = ()


@dataclass
class RequestTiming:
    """Wall-clock seconds since the decoder's run started."""

    admitted_s: float  # the request took a slot (its prefill starts)
    first_token_s: float | None = None  # its first output token was emitted
    finished_s: float | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.admitted_s

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.admitted_s


@dataclass
class RequestEvent:
    """What one step emitted for one request."""

    index: int  # the request's position in the stream
    tokens: list[int]
    text: str
    gamma: int
    stats: Stats  # the request's running totals
    timing: RequestTiming
    finish_reason: str | None = None  # set on the request's last event


@dataclass(frozen=True)
class BatchStep:
    """One step of the whole batch (the γ-over-time trace of a request load)."""

    at_s: float  # when it ended, seconds since the run started
    batch: int  # sequences in it
    gamma: int
    emitted: int  # tokens kept, all rows
    step_s: float


@dataclass
class _Row:
    index: int
    state: DecodeState
    rule: StopRule
    timing: RequestTiming
    text: TextStream
    out: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)

    @property
    def budget(self) -> int:
        return self.rule.max_new_tokens - len(self.out)


class BatchDecoder:
    def __init__(self, pipeline, slots: int, speculative: bool = True):
        """pipeline: a `Pipeline` (its target, proposer, verifier, controller); slots: the most
        sequences decoding at once (1 if the pipeline cannot batch: `pipeline.batch_refusal`)."""
        if slots < 1:
            raise ValueError("a batch needs at least one slot")
        self.pipeline = pipeline
        proposer = pipeline.proposer if speculative else None
        self.refusal = pipeline.batch_refusal(proposer)
        self.slots = slots if self.refusal is None else 1
        self.runner, self.proposer = _parts(pipeline, self.slots, proposer, self.refusal)
        self.hidden = pipeline.hidden if proposer is not None else ()
        self.limit = pipeline.context_limit()  # of one row: the batched caches have the same slots
        self.steps: list[BatchStep] = []

    def memory(self) -> dict[str, int]:
        target = self.runner.memory()
        parts = {"target weights": target.weights, "target KV cache": target.cache}
        return {**parts, **(self.proposer.memory() if self.proposer is not None else {})}

    def run(self, requests: Iterable[Request]) -> Iterator[RequestEvent]:
        """Decode a stream of requests, `slots` at a time; events of all requests, in step order.
        A list of requests is checked against the context before the first is decoded; a stream's
        requests one at a time, as each is admitted (before its prefill)."""
        if isinstance(requests, Sequence):
            self.pipeline.fit_all([(_name(i), self._ids(r), r.max_new_tokens) for i, r in enumerate(requests)])
        queue = iter(enumerate(requests))
        rows: list[_Row | None] = [None] * self.slots
        self.runner.crop_rows(torch.zeros(self.slots, dtype=torch.long))  # an interrupted earlier run left rows
        if self.proposer is not None:
            self.proposer.reset()
        self.steps = []
        self._started = time.perf_counter()
        exhausted = False
        while True:
            while not exhausted and None in rows:
                item = next(queue, None)
                if item is None:
                    exhausted = True
                    break
                slot = rows.index(None)  # the lowest free slot keeps the batch's rows packed
                rows[slot] = self._admit(slot, *item)
            busy = [(slot, row) for slot, row in enumerate(rows) if row is not None]
            if not busy:
                return
            for slot, row, event in self._step(busy):
                yield event
                if event.finish_reason is not None:
                    rows[slot] = None
                    self._release(slot)

    def _release(self, slot: int) -> None:
        """A free slot below a busy one rides along in every forward: with its old length it would
        be padded past the end of the cache, so its rows are emptied (the draft model's too)."""
        self.runner.reset_row(slot)
        drafter = getattr(self.proposer, "runner", None)  # BatchDrafter: a draft cache of its own
        if drafter is not None:
            drafter.reset_row(slot)

    def _now(self) -> float:
        return time.perf_counter() - self._started

    def _admit(self, slot: int, index: int, request: Request) -> _Row:
        pipeline = self.pipeline
        timing = RequestTiming(self._now())
        ids = self._ids(request)
        max_new_tokens = pipeline.fit(ids, request.max_new_tokens, _name(index))
        state = DecodeState(pipeline.runner, ids, torch.Generator().manual_seed(request.seed))
        if self.proposer is not None:
            state.early_stop = pipeline.controller.early_stop
        rule = StopRule(pipeline.target.tokenizer, pipeline.eos_ids, list(request.stop), max_new_tokens)
        row = _Row(index, state, rule, timing, TextStream(pipeline.target.tokenizer))
        started = time.perf_counter()
        self.runner.reset_row(slot)
        out = self.runner.forward_row(slot, ids[:-1], last_only=True, hidden=self.hidden) if len(ids) > 1 else None
        if self.proposer is not None:
            self.proposer.prefill(slot, state, out)
        row.stats.prefill_s = time.perf_counter() - started
        return row

    def _ids(self, request: Request) -> list[int]:
        return list(request.prompt) if is_ids(request.prompt) else self.pipeline.encode(request.prompt)

    def _step(self, busy: list[tuple[int, _Row]]) -> Iterator[tuple[int, _Row, RequestEvent]]:
        """One speculative step of every busy row (DESIGN.md "One step", batched)."""
        pipeline = self.pipeline
        slots, states = [slot for slot, _ in busy], [row.state for _, row in busy]
        t0 = time.perf_counter()
        gamma = pipeline.controller.gamma(len(busy)) if self.proposer is not None else 0  # 1.
        # a step emits <= γ + 1; one forward pads every row to the widest draft, so the fullest row
        # bounds every row's γ (its block would run past the cache; greedy output is unchanged)
        widest = gamma if self.limit is None else self.limit.tokens - max(len(row.state.tokens) for _, row in busy)
        gammas = [max(0, min(gamma, row.budget - 1, widest)) for _, row in busy]
        drafts = self.proposer.propose(slots, states, gammas) if any(gammas) else [DraftBlock.empty()] * len(busy)
        drafts = [trimmed(d, pipeline.room(s.tokens)) if isinstance(d, DraftTree) else d
                  for d, s in zip(drafts, states)]  # a tree has more nodes than γ: cut to its row's room
        t1 = time.perf_counter()
        out = self._verify_forward(slots, states, drafts)  # 3.
        verdicts = [pipeline.verifier.verify(draft, out.logits[slot, : len(draft.tokens) + 1], state.rng)
                    for slot, state, draft in zip(slots, states, drafts)]  # 4.
        t2 = time.perf_counter()
        self._commit(slots, states, verdicts)  # 5.
        timing = StepTiming(t1 - t0, t2 - t1)
        if self.proposer is not None:
            self.proposer.commit(slots, verdicts, out)
            pipeline.controller.update_batch(verdicts, timing, len(busy))  # 6.
        emitted = 0
        events = []
        for (slot, row), verdict in zip(busy, verdicts):
            keep, reason = row.rule.cut(row.out, verdict.emitted)
            tokens = verdict.emitted[:keep]
            row.out.extend(tokens)
            row.stats.record(verdict, timing, keep)
            emitted += keep
            now = self._now()
            if row.timing.first_token_s is None:
                row.timing.first_token_s = now
            if reason is not None:
                row.timing.finished_s = now
            text = row.text.push(tokens, final=reason is not None)
            events.append((slot, row, RequestEvent(row.index, tokens, text, verdict.gamma, row.stats, row.timing,
                                                   reason)))
        self.steps.append(BatchStep(self._now(), len(busy), gamma, emitted, timing.total_s))
        return iter(events)

    def _verify_forward(self, slots: list[int], states: list[DecodeState], drafts: list[DraftBlock | DraftTree]):
        """[last token, *draft] of every busy row in one forward; rows 0..max(slots), free ones
        (and the tail of shorter drafts) padded with the row's last token."""
        width = 1 + max(len(d.tokens) for d in drafts)
        ids = torch.zeros(max(slots) + 1, width, dtype=torch.long)  # [rows, 1 + max γ]
        for slot, state, draft in zip(slots, states, drafts):
            block = [state.tokens[-1], *draft.tokens.tolist()]
            ids[slot, : len(block)] = torch.tensor(block)
            ids[slot, len(block) :] = block[-1]
        trees = [d for d in drafts if isinstance(d, DraftTree)]
        if trees and len(drafts) > 1:
            raise AssertionError("tree drafts are verified one sequence at a time (batch_refusal)")
        ancestry = trees[0].ancestry() if trees else None
        return self.runner.forward_batch(ids, hidden=self.hidden, ancestry=ancestry)

    def _commit(self, slots: list[int], states: list[DecodeState], verdicts: list[Verdict]) -> None:
        """Each row keeps its emitted tokens; its cache is cut back to all of them but the last."""
        lengths = torch.zeros(max(slots) + 1, dtype=torch.long)  # free rows: nothing
        for slot, state, verdict in zip(slots, states, verdicts):
            start = len(state.tokens)
            if verdict.path:  # a tree: the accepted nodes sit at scattered rows of the block
                self.runner.keep_row(slot, start, [start - 1 + row for row in verdict.path])
            state.tokens.extend(verdict.emitted)
            lengths[slot] = len(state.tokens) - 1
        self.runner.crop_rows(lengths)


def _name(index: int) -> str:
    return f"Prompt #{index + 1}"


def _parts(pipeline, slots: int, proposer, refusal: str | None) -> tuple:
    """The batched target runner and proposer for `slots` rows, made once per pipeline: a KV
    cache of `slots` rows is hundreds of MiB, allocated (and zeroed) once, not per call."""
    parts = pipeline.batch_parts
    if ("runner", slots) not in parts:
        runner = pipeline.runner
        parts["runner", slots] = runner.batched(slots) if hasattr(runner, "batched") else _OneRow(runner)
    if proposer is not None and ("proposer", slots) not in parts:
        parts["proposer", slots] = proposer.batched(slots) if refusal is None else PerSlot(proposer, 1)
    return parts["runner", slots], parts.get(("proposer", slots)) if proposer is not None else None


class _OneRow:
    """The batch-row calls over a single-sequence runner (the hf engine): one slot, row 0."""

    def __init__(self, runner):
        self.runner = runner

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([self.runner.length])

    def memory(self):
        return self.runner.memory()

    def reset_row(self, row: int) -> None:
        self.runner.reset()

    def forward_row(self, row: int, ids: list[int], **kwargs):
        return self.runner.forward(ids, **kwargs)

    def forward_batch(self, ids: torch.Tensor, **kwargs):
        return self.runner.forward(ids[0].tolist(), **kwargs)

    def crop_rows(self, lengths: torch.Tensor) -> None:
        self.runner.crop(int(lengths[0]))

    def keep_row(self, row: int, start: int, slots: list[int]) -> None:
        self.runner.keep(start, slots)

