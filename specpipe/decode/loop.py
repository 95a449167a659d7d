"""The decode loop: one, batch-first, for one sequence and for many (a sequence is a batch of one).

A `Decoder` holds `slots` sequences, one per batch row of the target's KV cache (and of a draft
model's). Each step (docs/concepts.md "One step"):

  1. γ = controller.gamma(batch); each row's own γ ≤ it (its budget, the context, its request's
     `speculative` flag, the controller's `row_gamma`: the guard's pause; 0 is a plain step for that row)
  2. proposer.fill(rows, gammas)                    a draft model's own cache catches up where it lags
     draft = proposer.propose(rows, gammas)         DraftBatch [B, W] + num_draft [B], on the device
  3. out = runner.forward([last, *draft])            ONE forward of [B, W + 1]; logits stay on the device
  4. verdict = verifier.verify(draft, out.logits)    ids [B, W + 1] (-1 pad) + num_accepted [B], on the device
  5. host = verdict.copy_to_host().rows()            the step's ONE device-to-host copy (a plain step
                                                     queued ahead is launched between its start and its read)
  6. runner.commit / proposer.commit                 each row keeps what it accepted (host ints for shapes)
  7. controller.update, stats, stop rules (host)
  8. text and events (host)                          overlapped: once the next step is queued (the device runs it)

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
row has its own stop rule and its own randomness (`RowRandom`, seeded by its request), so a row
decodes exactly as its request would alone (bit for bit in the engine's exact precisions).

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
from dataclasses import dataclass, field

import torch

from specpipe.context import trimmed
from specpipe.decode.text import TextStream, is_ids
from specpipe.decode.timing import Clock
from specpipe.drafts import DraftBatch
from specpipe.engine.base import Split
from specpipe.metrics import Stats
from specpipe.sampling import RowRandom
from specpipe.stopping import StopRule
from specpipe.types import Rows
from specpipe.types import HostCopy, RowVerdict, Verdict


@dataclass(frozen=True)
class Request:
    prompt: str | list[dict] | list[int]  # text, chat messages, or token ids
    max_new_tokens: int = 128
    seed: int = 0  # of this request's own randomness
    stop: tuple[str, ...] = ()
    speculative: bool = True  # False: this request decodes plainly while its batch speculates


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
    held: bool = False  # the guard held this step at γ = 0 (speculation paused, or a plain probe)


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
    tokens: list[int]  # committed: prompt and output
    rule: StopRule
    timing: RequestTiming
    text: TextStream
    rng: RowRandom
    speculative: bool
    held: bool = False  # this step: the controller gave γ = 0 where the step's γ allowed more (the guard)
    done: bool = False  # finished: a step queued before its last one was read is dropped for it
    out: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)

    @property
    def budget(self) -> int:
        return self.rule.max_new_tokens - len(self.out)


@dataclass(slots=True)
class _Launched:
    """A step queued on the device, its verdict's copy to the host started, not read yet."""

    busy: list[tuple[int, _Row]]
    rows: list[_Row | None]  # by slot: the row each batch row decoded for
    gamma: int
    plain: bool  # no row drafted: one token each, the rows' lengths known without the verdict
    draft: DraftBatch
    verdict: Verdict
    out: object  # the target's TargetOutput
    copy: HostCopy
    clock: Clock

    def carries(self, slot: int, row: "_Row | None") -> bool:
        """Whether `row` decoded in this step, at batch row `slot` (the next step continues it)."""
        return row is not None and slot < len(self.rows) and self.rows[slot] is row


@dataclass(slots=True)
class _Kept:
    """What a settled step kept of one row, its event not made yet."""

    slot: int
    row: _Row
    tokens: list[int]  # kept: the stop rule applied
    reason: str | None  # why the row finished (None: it goes on)
    gamma: int  # drafted for it
    held: bool  # the controller held it at γ 0 (`_Row.held` of this step: the next launch resets it)


class Decoder:
    def __init__(self, pipeline, slots: int, speculative: bool = True):
        """pipeline: a `Pipeline` (its runner, proposer, verifier, controller, tokenizer); slots:
        the most sequences decoding at once (1 if the pipeline cannot batch: `batch_refusal`)."""
        if slots < 1:
            raise ValueError("a batch needs at least one slot")
        self.pipeline = pipeline
        self.proposer = pipeline.proposer if speculative else None
        self.refusal = pipeline.batch_refusal(self.proposer)
        self.slots = slots if self.refusal is None else 1
        self.runner = pipeline.runner
        self.runner.reserve(self.slots)
        if self.proposer is not None:
            self.proposer.reserve(self.slots)
        self.hidden = pipeline.hidden if self.proposer is not None else ()
        self.limit = pipeline.context_limit()  # of one row: every row has the same slots
        # plain steps are queued before the last is read (the module docstring)
        self.overlap = overlaps(getattr(pipeline, "overlap", "auto"), self.runner.device)
        if self.proposer is not None:  # the guard prices the plain steps a pause would run at what they cost
            pipeline.controller.overlapped = self.overlap
        self.steps: list[BatchStep] = []
        self._started = time.perf_counter()
        self._since = None  # the last step's clock (its successor's host time counts from its end)
        self._empty: dict[int, DraftBatch] = {}  # a plain step's draft, by batch width

    def memory(self) -> dict[str, int]:
        return self.pipeline.memory()

    def run(self, requests: Iterable[Request]) -> Iterator[RequestEvent]:
        """Decode a stream of requests, `slots` at a time; events of all requests, in step order.
        A list of requests is checked against the context before the first is decoded; a stream's
        requests one at a time, as each is admitted (before its prefill)."""
        if isinstance(requests, Sequence):
            self.pipeline.fit_all([(_name(i), self._ids(r), r.max_new_tokens) for i, r in enumerate(requests)])
        queue = iter(enumerate(requests))
        rows: list[_Row | None] = [None] * self.slots
        self.runner.reset()  # an interrupted earlier run may have left rows
        self._started = time.perf_counter()
        self._since = None
        exhausted = False
        pending: _Launched | None = None  # a plain step queued on the device, its verdict not read yet
        kept: list[_Kept] = []  # the last settled step's rows: overlapped, their events wait for the next launch
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
                self._gammas(launched.busy, len(launched.rows))  # the controller's calls for it, after the update
                yield from self._events(kept)
                kept = []
            if pending is None:
                kept = self._settled(launched, rows)
                if not self.overlap:  # a synchronous device has nothing to overlap: no event waits
                    yield from self._events(kept)
                    kept = []
            earlier = launched = None  # settled steps' tensors are freed before the next step allocates

    def _settled(self, launched: _Launched, rows: list[_Row | None]) -> list[_Kept]:
        """A step settled, and the slots of the rows it finished freed (the next admission takes them)."""
        kept = self._settle(launched)
        for step in kept:
            if step.reason is not None:
                rows[step.slot] = None
                self._release(step.slot, step.row)
        return kept

    def _events(self, kept: list[_Kept]) -> Iterator[RequestEvent]:
        """A settled step's events: each row's new text (incremental detokenization) and the
        consumer's turn, the host work that can wait until the next step is queued."""
        for step in kept:
            row = step.row
            text = row.text.push(step.tokens, final=step.reason is not None)
            yield RequestEvent(row.index, step.tokens, text, step.gamma, row.stats, row.timing, step.reason,
                               step.held)

    def _feeds(self, pending: _Launched, busy: list[tuple[int, _Row]]) -> bool:
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
                                   and self.pipeline.controller.holds([slot for slot, _ in speculating], len(busy)))

    def _release(self, slot: int, row: _Row) -> None:
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
        return list(request.prompt) if is_ids(request.prompt) else self.pipeline.encode(request.prompt)

    def _admit(self, slot: int, index: int, request: Request) -> _Row:
        pipeline = self.pipeline
        timing = RequestTiming(self._now())
        ids = self._ids(request)
        max_new_tokens = pipeline.fit(ids, request.max_new_tokens, _name(index))
        rule = StopRule(pipeline.target.tokenizer, pipeline.eos_ids, list(request.stop), max_new_tokens)
        speculative = self.proposer is not None and request.speculative
        row = _Row(index, list(ids), rule, timing, TextStream(pipeline.target.tokenizer), RowRandom(request.seed),
                   speculative)
        started = time.perf_counter()
        self.runner.reset(slot)
        self.runner.expect(slot, len(ids) + max_new_tokens)  # one attention width for all its steps
        hidden = self.hidden if speculative else ()
        out = self.runner.prefill(slot, ids[:-1], hidden=hidden) if len(ids) > 1 else None
        if speculative:
            self.proposer.prefill(slot, row.tokens, out)
            pipeline.controller.admit(slot)  # the guard's judgement of this row starts afresh
        row.stats.prefill_s = time.perf_counter() - started
        self._since = None  # a prefill is timed apart, not as the next step's host time
        return row

    def _gammas(self, busy: list[tuple[int, _Row]], width: int) -> tuple[int, list[int]]:
        """The step's γ and each row's: a step emits <= γ + 1, and one forward pads every row to
        the widest draft, so the fullest row bounds every row's γ (its block would run past the
        cache; greedy output is unchanged)."""
        controller = self.pipeline.controller
        speculating = [row for _, row in busy if row.speculative]
        gamma = controller.gamma(len(busy)) if speculating else 0
        widest = gamma if self.limit is None else self.limit.tokens - max(len(row.tokens) for _, row in busy)
        gammas = [0] * width
        for slot, row in busy:
            if row.speculative:
                allowed = max(0, min(gamma, row.budget - 1, widest))
                gammas[slot] = controller.row_gamma(slot, allowed)
                row.held = allowed > 0 and gammas[slot] == 0
        return max(gammas), gammas

    def _launch(self, busy: list[tuple[int, _Row]], pending: _Launched | None = None) -> _Launched:
        """Steps 1-4 and the start of 5: everything queued on the device, nothing read. A step
        after a `pending` one is plain (`_feeds`): it takes the rows' last tokens from pending's
        verdict, on the device, and the controller is asked for it once pending is read."""
        runner = self.runner
        width = busy[-1][0] + 1  # rows 0..width-1; free ones ride along
        rows = [None] * width
        for slot, row in busy:
            rows[slot] = row
        gamma, gammas = self._gammas(busy, width) if pending is None else (0, [0] * width)  # 1.
        view = self._view(rows) if any(gammas) else None
        clock = Clock(runner.device, self._since)
        clock.mark()
        if view is not None:
            self.proposer.fill(view, gammas)  # a draft model's cache catching up: timed apart
        clock.mark()
        draft = self._propose(view, rows, gammas)  # 2.
        clock.mark()
        block = self._block(rows, pending, draft)  # [B, W + 1]
        verifier = self.pipeline.verifier
        rngs = [row.rng if row else _IDLE for row in rows]
        out = runner.forward(block, tree=draft.tree, hidden=self.hidden, tail=verifier.tail(draft, rngs))  # 3. (and 4.
        if out.tail is not None:  # inside the forward's graph, where the runner has one)
            verdict = verifier.verdict_of(out.tail, draft)
        else:
            verdict = verifier.verify(draft.on(out.logits.device), out.logits, rngs)  # 4. (a host draft: moved)
        clock.mark()
        self._since = clock  # the next step's host time counts from its end
        for _, row in busy:
            row.rng.step += 1  # this step's draws are made
        plain = draft.width == 0
        if plain:  # one token a row: committed without the verdict, so the next step can be queued now
            runner.commit([1 if row else 0 for row in rows])
        return _Launched(busy, rows, gamma, plain, draft, verdict, out, verdict.copy_to_host(), clock)

    def _block(self, rows: list[_Row | None], pending: _Launched | None, draft: DraftBatch) -> torch.Tensor | Split:
        """[B, W + 1] the verify block: each row's last token, then its draft. On the host where
        the host knows all of it (the runner sends it with the step's other inputs, one copy),
        split where the host knows the last tokens and the device the draft, else on the device."""
        last = self._last(rows, pending)  # [B]
        if last.device.type == "cpu" and draft.host is not None:
            return torch.cat([last[:, None], draft.host], 1)
        if last.device.type == "cpu" and draft.width > 0:  # a head's or a draft model's draft: the runner joins them
            return Split(last[:, None], draft.tokens)
        last = last.to(self.runner.device, non_blocking=True)
        return last[:, None] if draft.width == 0 else torch.cat([last[:, None], draft.on(last.device).tokens], 1)

    def _last(self, rows: list[_Row | None], pending: _Launched | None) -> torch.Tensor:
        """[B] each row's last token: on the host where the host has them all, else on the
        device, from `pending`'s verdict for the rows it carries on (plain: its first column)."""
        fed = [pending is not None and pending.carries(slot, row) for slot, row in enumerate(rows)]
        host = [row.tokens[-1] if row is not None and not f else 0 for row, f in zip(rows, fed)]
        device = self.runner.device
        if not any(fed):
            return torch.tensor(host)
        carried = pending.verdict.ids[:, 0]  # [B'] the tokens pending emitted
        if len(rows) <= len(carried) and all(f or row is None for row, f in zip(rows, fed)):
            return carried[: len(rows)]  # no copy at all: the usual overlapped step
        if len(rows) > len(carried):
            carried = torch.cat([carried, carried.new_zeros(len(rows) - len(carried))])
        picks = torch.tensor([host, fed]).to(device, non_blocking=True)  # [2, B]: one copy
        return torch.where(picks[1].bool(), carried[: len(rows)], picks[0])

    def _settle(self, launched: _Launched) -> list[_Kept]:
        """Steps 5-7: wait for the verdict's copy, commit, learn, keep (the events come later)."""
        host = launched.copy.rows()  # 5.
        timing = launched.clock.timing()
        draft = launched.draft
        if not launched.plain:
            self.runner.commit([h.n_accepted + 1 if row else 0 for h, row in zip(host, launched.rows)],  # 6.
                               [h.path for h in host] if draft.tree is not None else None)
        if self.proposer is not None:
            self.proposer.commit(launched.verdict, host, launched.out)
            slots = [slot for slot, row in launched.busy if row.speculative]
            if slots:  # every row may have opted out of speculation
                self.pipeline.controller.update_rows(slots, [host[slot] for slot in slots], timing,
                                                     len(launched.busy))
        live = [(slot, row) for slot, row in launched.busy if not row.done]  # a row stopped before: dropped
        return self._emit(live, host, timing, launched.gamma)  # 7.

    def _view(self, rows: list[_Row | None]) -> Rows:
        """What the proposer sees of the rows this step."""
        trees = len(rows) == 1 and self.pipeline.verifier.verifies_trees and self.pipeline.runner.trees
        return Rows([row.tokens if row else [] for row in rows], [row.rng if row else _IDLE for row in rows],
                    self.pipeline.controller.stop_below, self.runner.device, trees=trees)

    def _propose(self, view: Rows | None, rows: list[_Row | None], gammas: list[int]) -> DraftBatch:
        if view is None:  # no row drafts
            empty = self._empty.get(len(rows))  # read only: one per width, no launch a plain step
            if empty is None:
                empty = self._empty[len(rows)] = DraftBatch.empty(len(rows), self.runner.device)
            return empty
        draft = self.proposer.propose(view, gammas)
        if draft.tree is not None:  # a chain fits (γ < budget); a tree has more nodes than γ: cut to the room
            draft = trimmed(draft, self.pipeline.room(rows[0].tokens))
        return draft

    def _emit(self, busy, host: list[RowVerdict], timing, gamma: int) -> list[_Kept]:
        """Per row: the stop rule, stats and what it keeps (host work the next step needs: its
        rows' tokens, budgets and whether they finished; the text waits, `_events`)."""
        emitted = 0
        kept = []
        for slot, row in busy:
            verdict = host[slot]
            row.tokens.extend(verdict.emitted)
            keep, reason = row.rule.cut(row.out, verdict.emitted)
            tokens = verdict.emitted[:keep]
            row.out.extend(tokens)
            row.stats.record(verdict, timing, keep, held=row.held)
            emitted += keep
            now = self._now()
            if row.timing.first_token_s is None:
                row.timing.first_token_s = now
            if reason is not None:
                row.timing.finished_s = now
                row.done = True
            kept.append(_Kept(slot, row, tokens, reason, verdict.gamma, row.held))
        if busy:  # (a step whose rows had all stopped before it was read emitted nothing)
            self.steps.append(BatchStep(self._now(), len(busy), gamma, emitted, timing.total_s))
        return kept


_IDLE = RowRandom(0)  # a free row's randomness: drawn from, never used
OVERLAP = ("auto", "on", "off")  # `overlap=`: plain steps queued before the last is read (auto: on CUDA)


def overlaps(overlap: str, device: torch.device) -> bool:
    """Whether plain steps overlap the host with the device (auto: where the device runs
    asynchronously, so the host's work between steps can hide behind the next step's kernels)."""
    return overlap == "on" or (overlap == "auto" and torch.device(device).type == "cuda")


def _name(index: int) -> str:
    return f"Prompt #{index + 1}"
