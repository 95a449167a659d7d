"""The controller interface: `gamma(batch) -> int` before a step, `update(slots, verdicts, timing,
batch)` after it (one call a step, every speculating row's verdict), `stop_below(position)`,
and per batch row `admit(slot)` and `row_gamma(slot, gamma)` (by default a row takes the batch's
γ: the guard, controllers/guard.py, overrides them).

What the steps cost is kept in one `StepMeter` (controllers/meter.py): the decode step records
each step in it (decode/step.py, step 7) before it calls `update`, and every controller reads
it, the guard and the controller it wraps the same one, so the steps are timed once whatever
reads them. What a controller knows of the pipeline comes at construction (keyword arguments,
from the build's context: `settings`): its `schedule`, and whether plain steps are queued ahead
of the host (`overlapped`, the meter's), not written into it later.

γ logic lives here and only here, never inside a proposer. Every controller is bounded by
`gamma_min` / `gamma_max`; only a controller that can tell speculation does not pay (the cost
model) goes down to γ = 0, which makes the next step a plain decoding step, and the guard under
every controller sets a row to γ = 0 where its speculation measured slower than plain steps. A
batch takes one γ per step (vLLM's rule: the verify block is one shape); a row may take less. A `schedule`
(`batch_schedule=`, vLLM's γ per batch size) fixes γ at the batch sizes it covers, whatever the
controller would pick: the entry of the largest batch size not above the batch's applies.
"""

from __future__ import annotations

from specpipe.controllers.meter import StepMeter
from specpipe.errors import SpecpipeError
from specpipe.types import RowVerdict, StepTiming


class Controller:
    adapts = True  # γ moves within [gamma_min, gamma_max]; False: it stays the configured γ (fixed, confidence)
    meter: StepMeter

    def __init__(self, gamma: int, gamma_min: int = 1, gamma_max: int = 8, *, schedule: dict[int, int] | None = None,
                 overlapped: bool = False, meter: StepMeter | None = None):
        """schedule: batch size -> γ (`batch_schedule=`, checked); overlapped: the decode loop
        queues plain steps ahead of the host (decode/loop.py, `overlap`), so plain decoding costs
        a step's own time, without the host's between steps; meter: the steps' costs, where
        another part keeps them already (default: a meter of its own)."""
        check_gamma(gamma)
        if not 0 <= gamma_min <= gamma_max:
            raise SpecpipeError(
                f"gamma_min={gamma_min} and gamma_max={gamma_max} must satisfy 0 <= gamma_min <= "
                "gamma_max (e.g. gamma_min=1 gamma_max=8)."
            )
        self.gamma_min, self.gamma_max = gamma_min, gamma_max
        self._gamma = self.clamp(gamma)
        self.schedule: dict[int, int] = check_schedule(schedule)  # batch size -> γ (batch_schedule=)
        self.meter = meter if meter is not None else StepMeter(overlapped=overlapped)

    @property
    def overlapped(self) -> bool:
        """Whether plain steps are queued ahead of the host (the meter prices them so)."""
        return self.meter.overlapped

    @overlapped.setter
    def overlapped(self, value: bool) -> None:  # a controller driven by hand (tests, a decoder of its own)
        self.meter.overlapped = value

    def clamp(self, gamma: int) -> int:
        return max(self.gamma_min, min(self.gamma_max, gamma))

    def gamma(self, batch: int = 1) -> int:
        """Draft tokens to propose in the next step of a batch of `batch` sequences."""
        covered = [size for size in self.schedule if size <= batch]
        return self.schedule[max(covered)] if covered else self.choose(batch)

    def widest(self) -> int:
        """The largest γ `gamma` can return: gamma_max if it adapts, else its γ; or its schedule's."""
        return max([self.gamma_max if self.adapts else self._gamma, *self.schedule.values()])

    def choose(self, batch: int) -> int:
        """The controller's own pick (default: its current γ, whatever the batch)."""
        return self._gamma

    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        """Learn from the step just taken: the verdicts of the rows that speculated in it (batch
        rows `slots`), the step's shared timing and its batch size; its cost is in the meter
        already (`record`). Default: nothing to learn."""

    def admit(self, slot: int) -> None:
        """A new request took batch row `slot` (default: nothing to forget)."""

    def row_gamma(self, slot: int, gamma: int) -> int:
        """The γ of batch row `slot` this step, given the step's (default: the step's)."""
        return gamma

    def holds(self, slots: list[int], batch: int) -> bool:
        """Whether the next step (of `batch` rows) gives every one of these rows γ 0 whatever the
        step in flight shows when it is read, so the loop may queue that plain step before
        reading the one in flight (decode/loop.py); the γ calls for it come after the update.
        Default: where the schedule fixes γ 0 at this batch size (else it is not known)."""
        covered = [size for size in self.schedule if size <= batch]
        return bool(covered) and self.schedule[max(covered)] == 0

    def stop_below(self, position: int) -> float:
        """A drafter stops after draft token `position` where its top probability is below this
        (0.0: it never stops early). A threshold, not a yes/no, so drafters on a GPU apply it as
        a mask without reading their confidence back."""
        return 0.0


def record(meter: StepMeter, verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
    """A step's cost into the meter, before any controller learns from it: the widest draft
    verified is the block every row's forward was."""
    meter.record(timing, batch, max((verdict.gamma for verdict in verdicts), default=0))


def settings(context) -> dict:
    """What a controller's build passes on from the build's context: the schedule and the
    overlap (none where only its options are checked: no context)."""
    if context is None:
        return {}
    return {"schedule": context.batch_schedule, "overlapped": context.overlapped}


def check_gamma(gamma: int, what: str = "gamma") -> int:
    if not isinstance(gamma, int) or gamma < 1:
        raise SpecpipeError(
            f"{what}={gamma!r} is not a positive integer. Speculation needs at least one draft "
            f"token per step: use {what}=1 or more (e.g. gamma=4), or proposer=none for plain decoding."
        )
    return gamma


def check_schedule(schedule) -> dict[int, int]:
    """batch_schedule={1: 4, 4: 2, 8: 0} -> {batch size: γ}, checked (γ = 0: plain decoding there)."""
    if not schedule:
        return {}
    try:
        items = {int(size): int(gamma) for size, gamma in dict(schedule).items()}
    except (TypeError, ValueError, AttributeError):
        items = None
    if items is None or any(size < 1 or gamma < 0 for size, gamma in items.items()):
        raise SpecpipeError(
            f"batch_schedule={schedule!r} must map batch sizes (>= 1) to γ (>= 0; 0 is plain decoding), "
            "e.g. batch_schedule='{1: 4, 4: 2, 8: 0}'."
        )
    return dict(sorted(items.items()))
