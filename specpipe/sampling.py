"""Sampling settings and the one function that turns logits into a distribution.

The same `SamplingParams.probs` is applied to target and draft logits, so both distributions
live in the same (temperature-scaled, top-k/top-p truncated) space; that is what keeps
rejection sampling lossless with respect to what plain sampling would produce. Everything is
float32 regardless of the model's precision. temperature = 0 means greedy: the distribution
is one-hot on the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k truncation
    top_p: float = 1.0  # 1.0: no nucleus truncation

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecpipeError(
                f"temperature={self.temperature} is negative. Use temperature=0 for greedy "
                "decoding or a positive value (e.g. temperature=0.7) for sampling."
            )
        if self.top_k < 0:
            raise SpecpipeError(f"top_k={self.top_k} is negative. Use top_k=0 to disable top-k.")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecpipeError(
                f"top_p={self.top_p} is outside (0, 1]. Use top_p=1.0 to disable nucleus sampling."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] -> probabilities [..., V] float32."""
        logits = logits.float()
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / self.temperature
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> token ids [...], drawn with the explicit generator on the probabilities'
    device without a host sync: argmax of probs / E with E ~ Exp(1) picks token i with
    probability probs[i] (the exponential race; gpt-fast's multinomial_sample_one_no_sync)."""
    return race(probs, race_draws(torch.empty_like(probs), rng))


def race_draws(out: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """`out` filled in place with the race's Exp(1) draws from `rng`: what `sample` draws, drawn
    apart (before a CUDA graph that samples replays: a graph cannot draw from a host-seeded
    generator, but can read its draws from a buffer)."""
    return out.exponential_(1, generator=rng)


def race(probs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """probs [..., V], their race's draws [..., V] -> the winning token ids [...]."""
    return (probs / draws).argmax(-1)


# What a step's draws are for: draft position i uses DRAFT + i; the verifier's uniforms and its
# recovered or bonus token have their own. Each is a stream of its own.
DRAFT, ACCEPT, RESAMPLE = 0, 1 << 20, (1 << 20) + 1


@dataclass
class RunRandom:
    """A run's stream, shared by every row whose request has no seed of its own (vLLM's rule),
    counter style: step s's draws for a purpose come from ONE generator seeded by (the run's
    seed, s, the purpose), one launch over all those rows. The run's seed (`seed=` of the
    config, `generate_batch`, `serve`) makes a run reproducible; what such a row samples depends
    on the rows beside it, as in any shared draw."""

    seed: int = 0
    step: int = 0  # the step the next `StepRandom.of(..., advance=True)` numbers


@dataclass
class RowRandom:
    """One row's randomness. A request with a seed has a stream of its own, counter style (as
    Philox's key and counter): its draws in a step come from a generator seeded by (its seed,
    its step, the purpose), so what it samples depends on its own request and step only, never
    on the rows beside it, how many draft tokens another row made or which device ran before: a
    seeded row in a batch samples what its request samples alone. A request without one
    (seed None) draws from its run's stream (`run`; None: seed 0's) in the step's one launch.
    Reseeding a generator is a host-side assignment, no device sync."""

    seed: int | None = None
    step: int = 0
    run: RunRandom | None = None

    def __call__(self, purpose: int, device: torch.device | str) -> torch.Generator:
        if self.seed is None:
            raise ValueError("a row without a seed of its own draws through its step's StepRandom")
        return _seeded(_mix(self.seed, self.step, purpose), device)


class StepRandom:
    """One step's randomness for a batch of B rows (`Rows.rngs`, a verifier's `rngs`): a draw
    of one purpose is ONE launch over every row without a seed of its own (and free rows, whose
    draws go unused), then each seeded row's draws overwritten from its own stream, so a batch
    where no request has a seed makes one draw launch per purpose. `exponential_` / `uniform_`
    fill a buffer (a CUDA graph's inputs, drawn before its replay: a graph cannot draw from a
    host-seeded generator); `exponential` makes one. `rngs[b]` is row b's own `RowRandom`
    (a seeded row's generator maker; an unseeded row has none: it draws in the shared launch)."""

    def __init__(self, rows: list[RowRandom | None], run: RunRandom, step: int):
        self.rows, self.run, self.step = rows, run, step  # rows[b] None: a free row

    @classmethod
    def of(cls, rngs: "StepRandom | list[RowRandom | None]", advance: bool = False) -> "StepRandom":
        """The step's randomness from each row's (None: a free row); a StepRandom as it is.
        advance: the run's stream moves on to its next step (the step's own call, once a step)."""
        if isinstance(rngs, StepRandom):
            return rngs
        rows = list(rngs)
        shared = [row for row in rows if row is not None and row.seed is None]
        run = next((row.run for row in shared if row.run is not None), None)
        if run is None:  # rows made without a run (a test's, a row alone): seed 0's stream at their step
            run = RunRandom(0, max((row.step for row in shared), default=0))
        step = run.step
        if advance:
            run.step += 1
        return cls(rows, run, step)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, b: int) -> RowRandom | None:
        """Row b's own randomness (None: a free row)."""
        return self.rows[b]

    def seeded(self, b: int) -> bool:
        """Whether row b draws from a stream of its own (its request has a seed)."""
        row = self.rows[b]
        return row is not None and row.seed is not None

    def exponential(self, purpose: int, shape: tuple[int, ...], device: torch.device | str,
                    rows: list[int] | None = None) -> torch.Tensor:
        """[A, *shape] Exp(1) draws (the race's) for batch rows `rows` (None: all B), row a for rows[a]."""
        count = len(self) if rows is None else len(rows)
        return self.exponential_(torch.empty(count, *shape, device=device), purpose, rows)

    def exponential_(self, out: torch.Tensor, purpose: int, rows: list[int] | None = None,
                     skip: list[bool] | None = None) -> torch.Tensor:
        """out [A, ...] filled with the race's Exp(1) draws, row a for batch row rows[a] (None: a).
        skip[a]: row a draws nothing of its own this time (past its draft): ones if it is seeded
        (the race is then the argmax), the batch's draws if not; either way unused."""
        return self._fill(out, purpose, rows, skip, lambda x, g: x.exponential_(1, generator=g), None)

    def uniform_(self, out: torch.Tensor, purpose: int, counts: list[int], rows: list[int] | None = None) -> torch.Tensor:
        """out [A, C] filled with U(0, 1) draws, row a for batch row rows[a] (None: a). The shared
        launch draws [A, max(counts)], so its numbers do not depend on C (an eager block and a
        graph's wider buffer get the same); a seeded row draws its own counts[a] (its γ, so its
        draws never depend on its neighbours). Either keeps the first C where it drew more."""
        return self._fill(out, purpose, rows, None, lambda x, g: x.uniform_(generator=g), counts)

    def _fill(self, out: torch.Tensor, purpose: int, rows: list[int] | None, skip: list[bool] | None,
              draw, counts: list[int] | None) -> torch.Tensor:
        rows = list(range(out.shape[0])) if rows is None else rows
        seeded = [self.seeded(b) for b in rows]
        skip = skip or [False] * len(rows)
        shared = any(not own and not past for own, past in zip(seeded, skip))
        if shared:  # the step's one launch for this purpose
            generator = _seeded(_mix(self.run.seed, self.step, purpose), out.device)
            if counts is None:
                _drawn(out, draw, generator)
            else:  # [A, the most γ]: a row's numbers do not depend on how wide the block or buffer is
                _drawn_columns(out, max(counts, default=0), draw, generator)
        for a, b in enumerate(rows):
            if skip[a] and (seeded[a] or not shared):
                out[a].fill_(1.0)
            elif not seeded[a]:
                continue
            elif counts is None:
                _drawn(out[a], draw, self.rows[b](purpose, out.device))
            else:
                _uniforms_into(out[a], counts[a], self.rows[b](purpose, out.device))
        return out


def _drawn(out: torch.Tensor, draw, generator: torch.Generator) -> None:
    """Draw into `out` as into a fresh tensor of its shape: in place where it is contiguous, else
    drawn apart and copied (a graph's buffer is wider than the block: the same numbers either way)."""
    if out.is_contiguous():
        draw(out, generator)
    else:
        out.copy_(draw(torch.empty_like(out, memory_format=torch.contiguous_format), generator))


def _drawn_columns(out: torch.Tensor, columns: int, draw, generator: torch.Generator) -> None:
    """Draw [A, columns] and keep what fits in out [A, C] (columns past them: left as they are)."""
    if columns == out.shape[1]:
        _drawn(out, draw, generator)
    else:
        kept = min(columns, out.shape[1])
        out[:, :kept].copy_(draw(out.new_empty(out.shape[0], columns), generator)[:, :kept])


def _uniforms_into(row: torch.Tensor, gamma: int, generator: torch.Generator) -> None:
    """A row's γ uniforms into its buffer row [C], in place where they fit (a block narrower than
    γ + 1 keeps the first C: the draft is no wider), the same values either way."""
    if gamma <= row.shape[0]:
        _drawn(row[:gamma], lambda x, g: x.uniform_(generator=g), generator)
    else:
        row.copy_(torch.rand(gamma, generator=generator, device=row.device)[: row.shape[0]])


def _seeded(seed: int, device: torch.device | str) -> torch.Generator:
    generator = _generator(torch.device(device))
    generator.manual_seed(seed)
    return generator


_GENERATORS: dict[torch.device, torch.Generator] = {}


def _generator(device: torch.device) -> torch.Generator:
    if device not in _GENERATORS:
        _GENERATORS[device] = torch.Generator(device)
    return _GENERATORS[device]


def _mix(seed: int, step: int, purpose: int) -> int:
    """A 63-bit seed from three counters (splitmix64's finaliser over their combination)."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + purpose * 0x94D049BB133111EB) % (1 << 64)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return (x ^ (x >> 31)) >> 1
