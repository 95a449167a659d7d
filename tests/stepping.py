"""Driving a controller by hand as the decode step does (decode/step.py, step 7): the step's cost
into the meter every controller reads, then the controller's `update`."""

from specpipe.controllers.base import Controller, record
from specpipe.types import RowVerdict, StepTiming


def stepped(controller: Controller, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming,
            batch: int) -> None:
    record(controller.meter, verdicts, timing, batch)
    controller.update(slots, verdicts, timing, batch)
