"""`Stats`: what one generation measured, in the project's vocabulary.

acceptance rate = accepted / drafted. mean accepted length τ = emitted tokens / steps (bonus
included, vLLM's "mean acceptance length"). per-position acceptance[i] = P(draft token i
accepted | it was drafted). tokens/s counts decode time only (prefill is reported apart: it is
the same for the plain target and the pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpipe.types import RowVerdict, StepTiming


@dataclass
class Stats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    prefill_s: float = 0.0
    propose_s: float = 0.0
    verify_s: float = 0.0
    host_s: float = 0.0  # between steps (StepTiming.host_s): part of decoding's time
    setup_s: float = 0.0  # of the above, CUDA graphs captured mid-decode (StepTiming.setup_s): one-offs
    drafted_at: list[int] = field(default_factory=list)  # [position] drafts made there
    accepted_at: list[int] = field(default_factory=list)  # [position] drafts accepted there
    gamma_trace: list[int] = field(default_factory=list)  # γ of each step
    step_s: list[float] = field(default_factory=list)  # seconds of each step (propose + verify)
    emitted_trace: list[int] = field(default_factory=list)  # tokens each step emitted
    held: int = 0  # steps the guard held at γ = 0 (speculation paused, or a plain probe)

    def record(self, verdict: RowVerdict, timing: StepTiming, emitted: int, held: bool = False) -> None:
        self.steps += 1
        self.held += held
        self.drafted += verdict.gamma
        self.accepted += verdict.n_accepted
        self.emitted += emitted
        self.propose_s += timing.fill_s + timing.propose_s  # a draft cache's fill is the proposer's time
        self.verify_s += timing.verify_s
        self.host_s += timing.host_s
        self.setup_s += timing.setup_s
        self.gamma_trace.append(verdict.gamma)
        self.step_s.append(timing.total_s)
        self.emitted_trace.append(emitted)
        _grow(self.drafted_at, verdict.gamma)
        _grow(self.accepted_at, verdict.gamma)
        for i in range(verdict.gamma):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < verdict.n_accepted

    @property
    def decode_s(self) -> float:
        return self.propose_s + self.verify_s + self.host_s

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at) if d]

    @property
    def time_per_token_s(self) -> list[float]:
        """Per emitted token: its step's time shared by the tokens that step emitted."""
        return [s / n for s, n in zip(self.step_s, self.emitted_trace) for _ in range(n)]

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.emitted,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_acceptance": self.per_position_acceptance,
            "drafted_at": self.drafted_at,
            "accepted_at": self.accepted_at,
            "gamma_trace": self.gamma_trace,
            "guard_held": self.held,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "propose_s": self.propose_s,
            "verify_s": self.verify_s,
            "host_s": self.host_s,
            "setup_s": self.setup_s,
        }


def _grow(counts: list[int], length: int) -> None:
    counts.extend([0] * (length - len(counts)))
