"""The guard: speculation that never makes a request slower than plain decoding.

It wraps whatever controller is configured (fixed ones too) and changes nothing but γ, so the
output stays exact. Per request (per batch row) it compares what speculative steps realise with
what plain steps cost, from the step timings every controller receives anyway:

    gain = tokens the row's speculative step emitted × plain step seconds ÷ that step's seconds

the tokens a speculative step yields per plain step's worth of time (a plain step yields 1).
Speculation pays while a row's gain over all its speculative steps since it (re)started is
>= 1 (tokens over plain-step units, summed): the aim is a request never slower as a whole, and
acceptance comes in phases (a stretch of free text inside a code answer) that a short window
would take for the request's worth, pausing requests that pay overall.

- Plain cost, per batch size: the median of the last few steps in which no row verified a draft
  (held at γ = 0, or a lookup proposer that found nothing: such steps cost what a plain step
  costs under this proposer; shared by all requests: it is the machine's). Each request probes
  it on its first step and every `refresh` steps after (a plain probe: the step runs with every
  row at γ = 0): at batch > 1 a row alone at γ = 0 still pays for its neighbours' verify block,
  so only a whole plain step measures it, and there a row's probe is skipped where a plain step
  was measured in the last `refresh // 4` steps. While every row is paused, every step is a
  plain step.
- Only steps that verified a draft are judged: a row that was allowed γ > 0 but drafted nothing
  spent a plain step, which says nothing about what its drafts are worth.
- A row whose gain is under 1 after at least `window` speculative steps is paused: γ = 0 for
  it. After `probe_every` paused steps it speculates again for a trial of `window // 2` steps;
  a trial whose gain reaches 1 + `margin` resumes it, counting from the trial (hysteresis:
  noise around 1.0 should not flip it every step), else it is paused again and the wait
  doubles, up to `probe_max`.
- Gains, pauses and the probe schedule are each request's own, reset when a request takes its
  row (`admit`): alone (batch 1), a request's γ depends on its own steps and their timings only.

At batch > 1 a paused row emits one token in a step whose time its neighbours' drafts set; the
batch turns plain only once every row's speculation stops paying, which is the point where plain
steps serve every row better. γ chosen from measured time means that under sampling a guarded
request can draw another sample than in an earlier run (each draw is still exactly the target's
distribution); `guard=false` keeps γ, and so each seeded sample, as the controller alone decides.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from specpipe.controllers.base import Controller
from specpipe.types import RowVerdict, StepTiming


@dataclass
class RowGuard:
    """One request's verdict on speculation."""

    tokens: int = 0  # emitted by its speculative steps since it (re)started
    cost: float = 0.0  # their seconds, in plain steps
    judged: int = 0  # those steps
    steps: int = 0  # since the request took the row
    plain_at: int | None = None  # its step of the last plain probe (None: not yet)
    paused: bool = False
    trial: bool = False  # speculating again after a pause, judged after window // 2 steps
    wait: int = 0  # paused steps left before the next trial
    interval: int = 0  # the wait after a trial that did not pay (doubles)


class Guard(Controller):
    def __init__(self, inner: Controller, *, window: int = 8, probe_every: int = 8, probe_max: int = 64,
                 refresh: int = 64, margin: float = 0.05):
        self.inner = inner
        self.gamma_min, self.gamma_max = inner.gamma_min, inner.gamma_max
        self.window, self.probe_every, self.probe_max = window, probe_every, probe_max
        self.refresh, self.margin = refresh, margin
        self._rows: dict[int, RowGuard] = {}  # batch row -> its request's state
        self._plain: dict[int, deque] = {}  # batch size -> recent (step, seconds) of plain steps, all requests
        self._steps = 0
        self._probe_plain = False  # this step: every row at γ = 0 to measure the plain cost
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
        return RowGuard(interval=self.probe_every)

    def row_gamma(self, slot: int, gamma: int) -> int:
        row = self._rows.setdefault(slot, self._new_row())
        paused = row.paused and row.wait > 0
        self._given[slot] = 0 if gamma == 0 or self._probe_plain or paused else self.inner.row_gamma(slot, gamma)
        return self._given[slot]

    def paused(self, slot: int) -> bool:
        """Whether the guard holds this row at γ = 0 (what the live view shows)."""
        row = self._rows.get(slot)
        return row is not None and row.paused

    def update(self, verdict: RowVerdict, timing: StepTiming) -> None:
        self.update_rows([0], [verdict], timing, 1)

    def update_batch(self, verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        self.update_rows(list(range(len(verdicts))), verdicts, timing, batch)

    def update_rows(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        self._steps += 1
        self._rows = {slot: row for slot, row in self._rows.items() if slot in slots}  # finished requests' rows go
        given = [self._given.get(slot, verdict.gamma) for slot, verdict in zip(slots, verdicts)]
        if not any(verdict.gamma for verdict in verdicts):  # nothing drafted (held, or a lookup that found none)
            self._plain.setdefault(batch, deque(maxlen=5)).append((self._steps, timing.total_s))
        plain = self.plain_cost(batch)
        for slot, verdict, gamma in zip(slots, verdicts, given):
            row = self._rows.setdefault(slot, self._new_row())
            row.steps += 1
            if gamma > 0 and verdict.gamma > 0 and plain is not None:  # a draft was verified: judge it
                self._judge(row, verdict.n_accepted + 1, timing.total_s / plain)
            elif row.paused and not self._probe_plain:
                row.wait -= 1
        speculated = [v for v, g in zip(verdicts, given) if g > 0]
        self.inner.update_rows([s for s, g in zip(slots, given) if g > 0] if speculated else slots,
                               speculated or verdicts, timing, batch)

    def _judge(self, row: RowGuard, tokens: int, cost: float) -> None:
        """A speculative step (`tokens` emitted in `cost` plain steps' time): pause a row whose
        speculation costs more than it yields; a paused row's speculative step starts its trial."""
        if row.paused:
            row.paused, row.trial = False, True
        row.tokens, row.cost, row.judged = row.tokens + tokens, row.cost + cost, row.judged + 1
        gain = row.tokens / max(row.cost, 1e-9)
        if row.trial and row.judged >= max(self.window // 2, 1):
            if gain >= 1.0 + self.margin:
                row.trial, row.interval = False, self.probe_every  # it pays again
            else:
                self._pause(row, backoff=True)
        elif not row.trial and row.judged >= self.window and gain < 1.0:
            self._pause(row, backoff=False)

    def _pause(self, row: RowGuard, backoff: bool) -> None:
        if backoff:
            row.interval = min(2 * row.interval, self.probe_max)
        row.paused, row.trial, row.wait = True, False, row.interval
        row.tokens, row.cost, row.judged = 0, 0.0, 0

    # plain cost
    def plain_cost(self, batch: int) -> float | None:
        """Median seconds of a recent plain step at this batch size (None: none measured)."""
        samples = self._plain.get(batch)
        return statistics.median(s for _, s in samples) if samples else None

    def _plain_due(self, row: RowGuard) -> bool:
        """A request probes plain steps on its first step, then every `refresh` of its steps."""
        return row.plain_at is None or row.steps - row.plain_at >= self.refresh

    def _plain_stale(self, batch: int) -> bool:
        """No plain step at this batch size in the last `refresh // 4` steps (batch > 1: a
        neighbour's probe serves every row, and each probe stalls the whole batch's drafts)."""
        samples = self._plain.get(batch)
        return not samples or self._steps - samples[-1][0] >= max(self.refresh // 4, 1)


def guarded(controller: Controller | None, enabled: bool = True, **options) -> Controller | None:
    """The controller under a guard (`guard=true`), or as it is (`guard=false`, the default)."""
    if controller is None or not enabled or isinstance(controller, Guard):
        return controller
    return Guard(controller, **options)
