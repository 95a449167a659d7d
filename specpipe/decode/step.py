"""THE step: what one decode step does for a batch of rows, top to bottom (docs/concepts.md "One step").

launch: everything queued on the device, nothing read
  1. γ = controller.gamma(batch); each row's own γ ≤ it (its budget, the context, its request's
     `speculative` flag, the controller's `row_gamma`: the guard's pause); 0 is a plain step for that row
  2. proposer.fill(rows, gammas)                   a draft model's own cache catches up where it lags
     draft = proposer.propose(rows, gammas)        DraftBatch [B, W] + num_draft [B], on the device
  3. out = runner.forward([last, *draft])           ONE forward of [B, W + 1]; logits stay on the device
  4. verdict = verifier.verify(draft, out.logits)   ids [B, W + 1] (-1 pad) + num_accepted [B], its copy started
settle: the host
  5. host = launched.copy.rows()                    the step's ONE device-to-host copy
  6. runner.commit / proposer.commit                each row keeps what it accepted (host ints for shapes)
  7. meter.record, controller.update, stop rules, stats
  8. text and events                                decode/loop.py, overlapped with the next step where it can
A free slot below a busy one rides along as one padding token (rows[slot] is None).
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.controllers.base import record
from specpipe.decode.inputs import block, empty_draft
from specpipe.decode.parts import Parts
from specpipe.decode.request import Kept, Row
from specpipe.decode.timing import Clock
from specpipe.drafts import DraftBatch
from specpipe.sampling import StepRandom
from specpipe.types import HostCopy, RowVerdict, StepTiming, Verdict


@dataclass(slots=True)
class Launched:
    """A step queued on the device, its verdict's copy to the host started, not read yet."""

    busy: list[tuple[int, Row]]
    rows: list[Row | None]  # by slot: the row each batch row decoded for
    gamma: int
    plain: bool  # no row drafted: one token each, the rows' lengths known without the verdict
    draft: DraftBatch
    verdict: Verdict
    out: object  # the target's TargetOutput
    copy: HostCopy
    clock: Clock

    def carries(self, slot: int, row: Row | None) -> bool:
        """Whether `row` decoded in this step, at batch row `slot` (the next step continues it)."""
        return row is not None and slot < len(self.rows) and self.rows[slot] is row


def launch(parts: Parts, busy: list[tuple[int, Row]], pending: Launched | None, since: Clock | None) -> Launched:
    """Steps 1-4. A step after a `pending` one is plain: it takes the rows' last tokens from
    pending's verdict, on the device (decode/loop.py queues it before pending is read)."""
    rows: list[Row | None] = [None] * (busy[-1][0] + 1)
    for slot, row in busy:
        rows[slot] = row
    gamma, gammas = parts.gammas(busy, len(rows)) if pending is None else (0, [0] * len(rows))  # 1.
    random = StepRandom.of([row.rng if row else None for row in rows], advance=True)  # the step's draws, every part's
    view = parts.view(rows, random) if any(gammas) else None
    clock = Clock(parts.runner.device, since)
    clock.mark()
    if view is not None:
        parts.proposer.fill(view, gammas)  # a draft model's cache catching up: timed apart
    clock.mark()
    draft = parts.propose(view, rows, gammas) if view is not None else empty_draft(len(rows), parts.runner.device)  # 2.
    clock.mark()
    tail = parts.verifier.tail(draft, random)  # the verdict inside the forward's graph, where the runner has one
    out = parts.runner.forward(block(parts.runner, rows, pending, draft), tree=draft.tree, hidden=parts.hidden,
                               tail=tail)  # 3.
    verdict = (parts.verifier.verdict_of(out.tail, draft) if out.tail is not None  # 4.
               else parts.verifier.verify(draft.on(out.logits.device), out.logits, random))
    clock.mark()
    for _, row in busy:
        row.rng.step += 1  # this step's draws are made
    plain = draft.width == 0
    if plain:  # one token a row: committed without the verdict, so the next step can be queued now
        parts.runner.commit([1 if row else 0 for row in rows])
    return Launched(busy, rows, gamma, plain, draft, verdict, out, verdict.copy_to_host(), clock)


def settle(parts: Parts, launched: Launched, now) -> tuple[list[Kept], StepTiming]:
    """Steps 5-7: wait for the verdict's copy, commit, learn, keep (the events come later).
    now: seconds since the run started, a callable (a request's first and last token times)."""
    host = launched.copy.rows()  # 5.
    timing = launched.clock.timing()
    if not launched.plain:  # 6.
        parts.runner.commit([h.n_accepted + 1 if row else 0 for h, row in zip(host, launched.rows)],
                            [h.path for h in host] if launched.draft.tree is not None else None)
    if parts.proposer is not None:
        parts.proposer.commit(launched.verdict, host, launched.out)
        slots = [slot for slot, row in launched.busy if row.speculative]
        if slots:  # 7. the step's cost to the meter, then the controller learns (every row may have opted out)
            verdicts = [host[slot] for slot in slots]
            record(parts.controller.meter, verdicts, timing, len(launched.busy))
            parts.controller.update(slots, verdicts, timing, len(launched.busy))
    live = [(slot, row) for slot, row in launched.busy if not row.done]  # a row stopped before: dropped
    return [keep(slot, row, host[slot], timing, now()) for slot, row in live], timing


def keep(slot: int, row: Row, verdict: RowVerdict, timing: StepTiming, now: float) -> Kept:
    """One row's share of a settled step: its stop rule, stats and what it keeps (host work the
    next step needs: its tokens, budget and whether it finished; the text waits for the loop)."""
    row.tokens.extend(verdict.emitted)
    count, reason = row.rule.cut(row.out, verdict.emitted)
    tokens = verdict.emitted[:count]
    row.out.extend(tokens)
    row.stats.record(verdict, timing, count, held=row.held)
    if row.timing.first_token_s is None:
        row.timing.first_token_s = now
    if reason is not None:
        row.timing.finished_s, row.done = now, True
    return Kept(slot, row, tokens, reason, verdict.gamma, row.held)
