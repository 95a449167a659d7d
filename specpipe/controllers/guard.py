"""The guard: speculation that never makes a request slower than plain decoding.

It wraps whatever controller is configured (fixed ones too) and changes nothing but γ, so the
output stays exact. Per request (per batch row), and per batch size as a whole, it compares
what speculative steps realise with what plain steps cost, from the step timings every
controller receives:

    gain = tokens the row's speculative step emitted × plain step seconds ÷ that step's seconds

Speculation pays while the gain summed since the row (re)started is >= 1. A row under it
after `window` judged steps, or one that has lost `loss_max` plain steps' worth, is paused
(γ = 0); after `probe_every` paused steps a trial of `window // 2` steps decides whether it
resumes (by `margin`) or waits twice as long (up to `probe_max`, and at least its loss over
`explore`; `recheck` steps where no draft could pay at these costs). Plain cost is the median
of recent plain steps per batch size (each request probes one every `refresh` steps), read,
with what speculative steps could reach, from the step meter it shares with the controller it
wraps (controllers/meter.py); steps that captured a CUDA graph are not judged, and a
proposer's cache fill is charged to its trial, not to a step. What the recent requests measured starts a new one (`prior` steps of
evidence where it paid, paused until the pipeline's next trial where it did not).

The rules and why each is so: docs/controllers.md, "The guard". `guard=false` keeps γ, and so
each seeded sample, as the controller alone decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specpipe.controllers.base import Controller
from specpipe.types import RowVerdict, StepTiming


@dataclass
class RowGuard:
    """A verdict on speculation: one request's (a row's), one batch size's, or the recent requests'."""

    tokens: float = 0.0  # emitted by its speculative steps since it (re)started (fading, per row: a batch)
    cost: float = 0.0  # their seconds, in plain steps (the proposer's cache fill apart)
    filled: float = 0.0  # plain steps' worth its proposer spent filling its cache since it (re)started
    judged: int = 0  # those steps
    steps: int = 0  # since the request took the row
    plain_at: int | None = None  # its step of the last plain probe (None: not yet)
    paused: bool = False
    trial: bool = False  # speculating again after a pause, judged after window // 2 steps
    wait: int = 0  # paused steps left before the next trial
    interval: int = 0  # the wait after a trial that did not pay (doubles)
    fade: float = 1.0  # the weight each judged step leaves on earlier ones (1: a request's whole run)
    size: bool = False  # a batch size's verdict (its trials are not the requests' schedule)


class Guard(Controller):
    def __init__(self, inner: Controller, *, window: int = 8, probe_every: int = 8, probe_max: int = 64,
                 refresh: int = 64, margin: float = 0.05, fade: float = 1 - 1 / 64, loss_max: float = 3.0,
                 explore: float = 0.03, prior: int = 4, reach: float = 0.9, recheck: int = 4096):
        self.inner = inner
        self.meter = inner.meter  # one record of the steps' costs: the inner controller reads it too
        self.gamma_min, self.gamma_max = inner.gamma_min, inner.gamma_max
        self.window, self.probe_every, self.probe_max = window, probe_every, probe_max
        self.refresh, self.margin, self.fade = refresh, margin, fade
        self.loss_max, self.explore, self.prior = loss_max, explore, prior
        self.reach, self.recheck = reach, recheck
        self._recent = RowGuard(fade=fade)  # every row's speculative steps, across requests (never paused)
        self._next_trial = 0  # where the recent requests did not pay: the step of the pipeline's next trial
        self._interval = probe_max // 2  # ... and the wait after it
        self._rows: dict[int, RowGuard] = {}  # batch row -> its request's state
        self._sizes: dict[int, RowGuard] = {}  # batch size (> 1) -> the verdict on speculating at that size
        self._steps = 0
        self._probe_plain = False  # this step: every row at γ = 0 to measure the plain cost
        self._hold_batch = False  # this step: every row at γ = 0, speculation at this batch size paused
        self._given: dict[int, int] = {}  # batch row -> the γ this step gives it

    # the inner controller's interface, passed through
    @property
    def schedule(self) -> dict[int, int]:
        return self.inner.schedule

    @schedule.setter
    def schedule(self, value: dict[int, int]) -> None:
        self.inner.schedule = value

    def gamma(self, batch: int = 1) -> int:
        gamma = self.inner.gamma(batch)
        due = [row for row in self._rows.values() if self._plain_due(row)]
        self._probe_plain = gamma > 0 and bool(due) and (batch == 1 or self._plain_stale(batch))
        size = self._size(batch) if batch > 1 else None
        self._hold_batch = gamma > 0 and size is not None and size.paused and size.wait > 0
        for row in due:  # probed now, or measured by a neighbour's probe a moment ago
            row.plain_at = row.steps
        self._given = {}
        return gamma

    def stop_below(self, position: int) -> float:
        return self.inner.stop_below(position)

    def widest(self) -> int:
        return self.inner.widest()

    # per row
    def admit(self, slot: int) -> None:
        self._rows[slot] = self._new_row()
        self.inner.admit(slot)

    def _new_row(self) -> RowGuard:
        """A request's state. Where the recent requests' speculation paid, it speculates and
        starts with their gain as `prior` steps of evidence: a head that pays over whole answers
        is not stopped by a poor opening (a small model's free text often turns repetitive,
        where lookups accept γ a step, only after a few dozen tokens). Where it did not pay, it
        starts paused until the pipeline's next trial: one exploration schedule across requests,
        since a trial of a draft model costs its cache's fill, as dear as a prefill, and a trial
        in every short request would spend more than the `explore` share."""
        recent = self._recent
        if self._recent_pays():
            row = RowGuard(interval=self.probe_every)
            if recent.judged >= self.window:  # the prior: a gain measured over enough steps
                row.tokens, row.cost = self.prior * recent.tokens / recent.cost, float(self.prior)
            return row
        wait = max(self._next_trial - self._steps, self.probe_max // 2)
        return RowGuard(paused=True, wait=wait, interval=self._interval)

    def _row(self, slot: int) -> RowGuard:
        """The state of the request in `slot` (a new one's where the loop did not admit it: a
        controller driven directly)."""
        row = self._rows.get(slot)
        if row is None:
            row = self._rows[slot] = self._new_row()
        return row

    def row_gamma(self, slot: int, gamma: int) -> int:
        row = self._row(slot)
        paused = row.paused and row.wait > 0
        held = gamma == 0 or self._probe_plain or self._hold_batch or paused
        self._given[slot] = 0 if held else self.inner.row_gamma(slot, gamma)
        return self._given[slot]

    def holds(self, slots: list[int], batch: int) -> bool:
        """Every row paused with more than one held step to wait, or the batch size's verdict so
        paused (batch > 1): the step in flight (held too) takes at most one, so the next is held
        whatever it shows. Or the inner controller's schedule holds the batch."""
        rows = [self._rows.get(slot) for slot in slots]
        size = self._sizes.get(batch) if batch > 1 else None
        return (all(row is not None and row.paused and row.wait >= 2 for row in rows)
                or (size is not None and size.paused and size.wait >= 2) or self.inner.holds(slots, batch))

    def paused(self, slot: int) -> bool:
        """Whether the guard holds this row at γ = 0, alone or with its batch (what the live view shows)."""
        row = self._rows.get(slot)
        return (row is not None and row.paused) or self._hold_batch

    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        self._steps += 1
        self._rows = {slot: row for slot, row in self._rows.items() if slot in slots}  # finished requests' rows go
        if timing.setup_s and self._probe_plain:  # a probe that captured a graph measured nothing: again next step
            for row in self._rows.values():
                if row.plain_at == row.steps:
                    row.plain_at = None
        given = [self._given.get(slot, verdict.gamma) for slot, verdict in zip(slots, verdicts)]
        undrafted = not any(verdict.gamma for verdict in verdicts)  # held, or lookups that found none: a plain sample
        plain = self.plain_cost(batch) if not timing.setup_s else None  # a capture's step is not judged
        cost = (timing.total_s - timing.fill_s) / plain if plain is not None else 0.0  # in plain steps
        # a step in which rows could draft but none did (lookups that found nothing) could not be
        # queued ahead: where plain steps are, it costs the host's time between steps on top
        missed = self.overlapped and undrafted
        for slot, verdict, gamma in zip(slots, verdicts, given):
            row = self._row(slot)
            row.steps += 1
            if gamma > 0 and verdict.gamma > 0 and plain is not None:  # a draft was verified: judge it
                row.filled += timing.fill_s / plain
                self._judge(row, verdict.n_accepted + 1, cost, batch)
                self._learn(self._recent, verdict.n_accepted + 1, cost)
            elif gamma > 0 and missed and plain is not None:  # read before the next was queued: its excess
                row.filled += timing.fill_s / plain
                self._judge(row, 1, cost, batch, counted=False)
                self._learn(self._recent, 1, cost, counted=False)
            elif row.paused and not self._probe_plain:
                row.wait -= 1
        if batch > 1 and plain is not None:
            self._judge_batch(batch, verdicts, given, cost, timing.fill_s / plain)
        speculated = [v for v, g in zip(verdicts, given) if g > 0]
        self.inner.update([s for s, g in zip(slots, given) if g > 0] if speculated else slots,
                          speculated or verdicts, timing, batch)  # the meter has the step already

    def _judge_batch(self, batch: int, verdicts: list[RowVerdict], given: list[int], cost: float,
                     filled: float) -> None:
        """The batch as a whole: the tokens a row emitted, on average, per plain step's worth of time
        (a plain step at this size yields one a row)."""
        size = self._size(batch)
        if any(g > 0 and verdict.gamma > 0 for verdict, g in zip(verdicts, given)):
            size.filled += filled
            self._judge(size, sum(verdict.n_accepted + 1 for verdict in verdicts) / batch, cost, batch)
        elif size.paused and self._hold_batch:
            size.wait -= 1

    def _size(self, batch: int) -> RowGuard:
        """The verdict on speculating at this batch size. Speculation pays less the more rows a
        batch has (a plain step of more rows uses more of the hardware, leaving less idle for
        draft tokens), so a size seen first starts paused where the nearest larger size measured
        is paused, and a trial after `probe_every` steps says otherwise: as a load drains, 7, 6,
        5 rows would each spend a judging window relearning what 8 rows found."""
        size = self._sizes.get(batch)
        if size is None:
            larger = [state for other, state in sorted(self._sizes.items()) if other > batch]
            paused = bool(larger) and larger[0].paused
            size = self._sizes[batch] = RowGuard(paused=paused, wait=self.probe_every if paused else 0,
                                                 interval=self.probe_every, fade=self.fade, size=True)
        return size

    def _judge(self, row: RowGuard, tokens: float, cost: float, batch: int, counted: bool = True) -> None:
        """A speculative step at this batch size (`tokens` emitted in `cost` plain steps' time,
        its proposer's cache fill apart): pause a row whose speculation costs more than it
        yields; a paused row's speculative step starts its trial. The fill is judged as the
        trial's price, not each step's: what the drafts are worth from here on decides whether
        to go on. A miss where plain steps are queued ahead (`counted=False`) adds its excess to
        the row's loss but is no judged step: the window's verdict on what drafts yield waits
        for drafts."""
        if row.paused:
            row.paused, row.trial = False, True
        self._learn(row, tokens, cost, counted)
        gain, lost = row.tokens / max(row.cost, 1e-9), row.cost - row.tokens
        if row.trial and (row.judged >= max(self.window // 2, 1) or lost >= self.loss_max / 2):
            if gain >= 1.0 + self.margin and lost < self.loss_max / 2:
                row.trial, row.interval = False, self.probe_every  # it pays again
            else:
                self._pause(row, batch, backoff=True)
        elif not row.trial and not self._pays(row):
            self._pause(row, batch, backoff=False)

    @staticmethod
    def _learn(state: RowGuard, tokens: float, cost: float, counted: bool = True) -> None:
        """A step's tokens and cost added to a verdict's sums (earlier steps faded by its `fade`)."""
        state.tokens, state.cost = state.fade * state.tokens + tokens, state.fade * state.cost + cost
        state.judged += counted

    def _pays(self, state: RowGuard) -> bool:
        """Speculation pays so far: it has not lost `loss_max` plain steps' worth, and after
        `window` judged steps its gain is at least 1."""
        lost = state.cost - state.tokens
        return lost < self.loss_max and (state.judged < self.window or lost <= 0)

    def _recent_pays(self) -> bool:
        """The recent requests' speculation yields more than a plain step's token per plain
        step's time, by `margin` (or none has been judged yet): its gain, not a request's rules,
        since its steps come from requests that each stopped once theirs said no. The margin,
        because a new request that speculates pays its draft's cache fill first: a proposer
        whose steps only break even (a twin drafting γ tokens at a target step each) loses."""
        return self._recent.tokens >= (1 + self.margin) * self._recent.cost

    def _pause(self, row: RowGuard, batch: int, backoff: bool) -> None:
        # the wait for its loss (fill included) to be an `explore` share of the time
        spent = math.ceil((max(row.cost - row.tokens, 0.0) + row.filled) / self.explore)
        if backoff:  # the trial did not pay: wait longer, and long enough that its loss stays a small share
            row.interval = max(min(2 * row.interval, self.probe_max), spent)
        hopeless = self._out_of_reach(batch)  # no draft can pay at these costs: only a change in them could
        if hopeless:
            row.interval = max(row.interval, self.recheck)
        if not row.size and not self._recent_pays():  # new requests wait for this schedule, doubling while trials fail
            self._interval = max(2 * self._interval if backoff else row.interval, spent)
            if hopeless:
                self._interval = max(self._interval, self.recheck)
            self._next_trial = self._steps + self._interval
        row.paused, row.trial, row.wait = True, False, row.interval
        row.tokens, row.cost, row.judged, row.filled = 0, 0.0, 0, 0.0

    def _out_of_reach(self, batch: int) -> bool:
        """Speculative steps at this batch size could not pay even had they kept `reach` of the
        tokens they could emit: each costs about as many plain steps as it could emit (a twin
        whose draft token costs a target step: γ + 1 tokens at best, in γ + 1 plain steps'
        time). What text comes next cannot change that, so trials wait `recheck` steps (the
        costs are the machine's, and change with its load or the batch), not the usual
        schedule, whose every trial pays the draft's cache fill for nothing. Judged on every
        request's steps at this size, after a trial's worth of them (`window // 2`; a dear
        proposer is paused by the loss rule within a few): a step or two while the machine is
        busy is no verdict. (The reach is the meter's, faded at its rate.)"""
        reach = self.meter.reach(batch)
        return (reach is not None and reach.judged >= max(self.window // 2, 1)
                and reach.possible * self.reach < (1 + self.margin) * reach.cost)

    # plain cost
    def plain_cost(self, batch: int) -> float | None:
        """Median seconds of a recent plain step at this batch size (None: none measured)."""
        return self.meter.plain_cost(batch)

    def _plain_due(self, row: RowGuard) -> bool:
        """A request probes plain steps on its first step, then every `refresh` of its steps."""
        return row.plain_at is None or row.steps - row.plain_at >= self.refresh

    def _plain_stale(self, batch: int) -> bool:
        """No plain step at this batch size in the last `refresh // 4` steps (batch > 1: a
        neighbour's probe serves every row, and each probe stalls the whole batch's drafts)."""
        age = self.meter.plain_age(batch)
        return age is None or age >= max(self.refresh // 4, 1)


def guarded(controller: Controller | None, enabled: bool = True, **options) -> Controller | None:
    """The controller under a guard (`guard=true`, the default), or as it is (`guard=false`)."""
    if controller is None or not enabled or isinstance(controller, Guard):
        return controller
    return Guard(controller, **options)
