"""What decoding a request passes around: the `Request` itself, its timing, the events a step
emits for it, the batch's step trace, the `Row` a request decodes in (its committed tokens,
stop rule, randomness and totals) while it holds a slot, and what a step `Kept` of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpipe.decode.text import TextStream
from specpipe.metrics import Stats
from specpipe.sampling import RowRandom
from specpipe.stopping import StopRule


@dataclass(frozen=True)
class Request:
    prompt: str | list[dict] | list[int]  # text, chat messages, or token ids
    max_new_tokens: int = 128
    seed: int | None = None  # a stream of its own (sampled alike in any batch); None: the run's shared stream
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
class Row:
    """A request while it holds a batch row (a slot)."""

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
class Kept:
    """What a settled step kept of one row, its event not made yet (decode/step.py `keep`)."""

    slot: int
    row: Row
    tokens: list[int]  # kept: the stop rule applied
    reason: str | None  # why the row finished (None: it goes on)
    gamma: int  # drafted for it
    held: bool  # the controller held it at γ 0 (`Row.held` of this step: the next launch resets it)
