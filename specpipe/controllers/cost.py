"""Cost model: pick the γ that maximises expected tokens per second.

Keeps a moving average of the per-position acceptance α_i = P(draft token i accepted | tokens
before it were), and moving medians of the propose cost per draft token and of the verify cost
of a k-token forward (a line a + b·k fitted to the block sizes seen in the last `memory`
steps). Medians, because the first forward of a new block shape is several times slower
(kernel set-up) and would skew an average for many steps; a memory, because a block size
measured slow once and not tried since would otherwise keep γ below it. Then, for every γ in
the bounds,

    E(γ)    = 1 + Σ_{i≤γ} Π_{j≤i} α_j          (expected tokens emitted by a step)
    cost(γ) = propose_per_token · γ + verify(γ + 1)
    γ*      = argmax E(γ) / cost(γ)            (γ = 0: a plain step, 1 / verify(1))

γ = 0 switches speculation off when it cannot pay. Every `probe_every` steps one step probes a
γ next to the best, one longer and one shorter in turn (γ = 1 when off), so estimates of
positions it stopped drafting stay fresh, the controller comes back when conditions improve,
and the verify cost line has two points to be fitted to even where one γ dominates (at a new
batch size only the starting γ has been measured: without the shorter probe its cost would be
extrapolated from one point forever).

In a batch every cost is a function of the batch size too (the verify forward of B rows of k
tokens, the draft steps of B rows): verify and propose samples are read per batch size from the
step meter every controller of the pipeline reads (controllers/meter.py: the guard's plain cost
comes from the same record of the same steps), the last `window` of each, and γ*
is chosen for the batch size of the step at hand. At a large batch a verify block costs close
to k one-token steps (the GEMMs turn compute-bound), so γ* falls, to 0 where speculation does
not pay at that load. A batch size never measured borrows the nearest measured one's costs
until its own samples arrive (probes measure it).
"""

from __future__ import annotations

import math
import statistics

from specpipe.controllers.base import Controller, settings
from specpipe.types import RowVerdict, StepTiming


class CostModelGamma(Controller):
    def __init__(self, gamma: int, gamma_min: int = 0, gamma_max: int = 8, *, smoothing: float = 0.2,
                 probe_every: int = 8, prior_acceptance: float = 0.7, window: int = 9, memory: int = 64,
                 **pipeline):
        """pipeline: `Controller`'s schedule, overlapped and meter."""
        super().__init__(gamma, gamma_min, gamma_max, **pipeline)
        self.smoothing = smoothing
        self.probe_every = probe_every
        self.alpha = [prior_acceptance] * max(gamma_max, 1)  # [position] conditional acceptance
        self._seen = [False] * max(gamma_max, 1)  # [position] judged by the target at least once
        self._window = window  # samples per batch size (and block size) the medians are of
        self._memory = memory  # steps after which a block size's verify costs are forgotten
        self._next = self._gamma  # what gamma() answers at the last step's batch size: the best γ, or a probe
        self._since_probe = 0
        self._probe_up = False  # the direction of the last probe
        self._last_batch = 1

    def propose_per_token(self, batch: int = 1) -> float | None:
        times = self.meter.propose_samples(self._measured(batch, self.meter.proposed_sizes()), self._window)
        return statistics.median(times) if times else None

    def verify_at(self, batch: int = 1) -> dict[int, float]:
        """Median verify seconds per block size at this batch size, over samples of the last
        `memory` steps only: a size measured slow once and never tried since would otherwise
        pin γ below it."""
        batch = self._measured(batch, self.meter.verified_sizes())
        return {k: statistics.median(times) for (_, k), times in self._verified(batch).items() if times}

    def _verified(self, batch: int | None = None) -> dict[tuple[int, int], list[float]]:
        """(batch size, block size) -> its recent verify seconds, those of the last `memory`
        steps; `batch`'s only (None: every batch size's)."""
        return self.meter.verify_samples(self._window, self._memory, batch)

    @staticmethod
    def _measured(batch: int, sizes: set[int]) -> int:
        """`batch` if it has samples, else the measured batch size nearest to it (by ratio)."""
        if batch in sizes or not sizes:
            return batch
        return min(sizes, key=lambda b: (abs(math.log(b / batch)), b))

    def choose(self, batch: int) -> int:
        """The best γ (or a probe) at the last step's batch size; at another, the best estimate there."""
        return self._next if batch == self._last_batch else self._pick(batch)

    def update(self, slots: list[int], verdicts: list[RowVerdict], timing: StepTiming, batch: int) -> None:
        gamma = max(v.gamma for v in verdicts)  # the step's block was γ + 1 wide for every row (the meter has its cost)
        for verdict in verdicts:
            self._observe_acceptance(verdict, gamma if batch > 1 else None)
        self._gamma, self._last_batch = self._pick(batch), batch
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            self._next = self._probe()
        else:
            self._next = self._gamma

    def _probe(self) -> int:
        """A γ next to the best: one longer and one shorter in turn, within the bounds."""
        self._probe_up = not self._probe_up
        up, down = min(self._gamma + 1, self.gamma_max), max(self._gamma - 1, self.gamma_min)
        if self._gamma == 0:
            return max(1, self.gamma_min)
        return up if (self._probe_up and up != self._gamma) or down == self._gamma else down

    def _pick(self, batch: int) -> int:
        if self.propose_per_token(batch) is None or not self.verify_at(batch):
            return self._gamma  # nothing measured yet: the configured γ
        return self.best_gamma(batch)

    def _observe_acceptance(self, verdict: RowVerdict, asked: int | None = None) -> None:
        """asked: the step's γ. In a batch a row that drafted fewer tokens than the block holds
        (n-gram lookup found nothing, a drafter stopped early) gains nothing from the positions it
        left empty, yet the block is as wide for it: those count as rejected, so E(γ) is what a
        row of this batch really emits (one sequence alone: a short draft makes a short block)."""
        short = asked is not None and verdict.n_accepted == verdict.gamma < asked
        judged = min(verdict.n_accepted + 1, verdict.gamma) + short  # positions with an outcome
        for i in range(min(judged, len(self.alpha))):
            if not self._seen[i] and i > 0:
                self.alpha[i] = self.alpha[i - 1]  # start from the rate it was borrowing
            self._seen[i] = True
            self.alpha[i] = self._ema(self.alpha[i], 1.0 if i < verdict.n_accepted else 0.0)

    def _ema(self, old: float, new: float) -> float:
        return old + self.smoothing * (new - old)

    def expected_tokens(self, gamma: int) -> float:
        expected, survive, alpha = 1.0, 1.0, self.alpha[0]
        for i in range(gamma):
            # a position never drafted so far borrows its predecessor's rate (optimism that lets
            # γ grow past what it has tried; the prior alone would pin γ where it started)
            alpha = self.alpha[i] if self._seen[i] else alpha
            survive *= alpha
            expected += survive
        return expected

    def verify_cost(self, k: int, at: dict[int, float] | None = None, batch: int = 1) -> float:
        """Fit a + b·k to the block sizes seen (b >= 0); one size alone: assume +10% per token."""
        at = self.verify_at(batch) if at is None else at
        ks = sorted(at)
        if len(ks) == 1:
            return at[ks[0]] * (1 + 0.1 * (k - ks[0]))
        mean_k = sum(ks) / len(ks)
        mean_t = sum(at.values()) / len(ks)
        slope = sum((x - mean_k) * (at[x] - mean_t) for x in ks) / sum((x - mean_k) ** 2 for x in ks)
        return max(mean_t + max(slope, 0.0) * (k - mean_k), 1e-9)

    def rows_cost(self) -> dict[int, float]:
        """Median verify seconds by the forward's row count M = batch size × block size, every
        batch size pooled (a forward's cost is mostly its GEMMs', a function of M)."""
        by_rows: dict[int, list[float]] = {}
        for (b, k), fresh in self._verified().items():
            if fresh:
                by_rows.setdefault(b * k, []).extend(fresh)
        return {m: statistics.median(times) for m, times in sorted(by_rows.items())}

    def batch_verify_cost(self, batch: int, k: int, rows: dict[int, float]) -> float:
        """A batch's verify cost at block size k: its own median where measured, else the pooled
        row-count curve at M = batch·k (linear between the measured M nearest it, extended by
        the slope of the last two beyond them). At batch > 1 a block size is measured only when
        γ goes there, and a line through this batch's own one or two sizes extrapolates badly:
        from 8·5 rows to 8·1 the GEMMs leave the compute-bound regime."""
        own = self._verified(batch).get((batch, k))
        if own:
            return statistics.median(own)
        m, ms = batch * k, list(rows)
        if len(ms) == 1:
            return rows[ms[0]] * (1 + 0.1 * (m - ms[0]) / batch)
        above = next((i for i, x in enumerate(ms) if x >= m), len(ms))
        lo, hi = (above - 1, above) if 0 < above < len(ms) else (0, 1) if above == 0 else (len(ms) - 2, len(ms) - 1)
        slope = max((rows[ms[hi]] - rows[ms[lo]]) / (ms[hi] - ms[lo]), 0.0)
        return max(rows[ms[lo]] + slope * (m - ms[lo]), 1e-9)

    def best_gamma(self, batch: int = 1) -> int:
        at, propose = self.verify_at(batch), self.propose_per_token(batch)  # medians: compute once per step
        rows = self.rows_cost() if batch > 1 else None

        def throughput(g: int) -> float:
            verify = self.batch_verify_cost(batch, g + 1, rows) if rows else self.verify_cost(g + 1, at)
            return self.expected_tokens(g) / (propose * g + verify)

        return max(range(self.gamma_min, self.gamma_max + 1), key=throughput)


def build(*, context, gamma: int, gamma_min: int = 0, gamma_max: int = 8, **options) -> CostModelGamma:
    return CostModelGamma(gamma, gamma_min, gamma_max, **options, **settings(context))
