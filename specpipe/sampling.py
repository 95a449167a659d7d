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


# What a row's draws in one step are for: draft position i uses DRAFT + i; the verifier's
# uniforms and its recovered or bonus token have their own. Each is a stream of its own.
DRAFT, ACCEPT, RESAMPLE = 0, 1 << 20, (1 << 20) + 1


@dataclass
class RowRandom:
    """One request's randomness, counter style (as Philox's key and counter): every draw of a
    step comes from a generator seeded by (the request's seed, the step, the purpose), so what a
    row samples depends on its own request and step only, never on the rows beside it, how many
    draft tokens another row made or which device ran before: a row in a batch samples what its
    request samples alone. Reseeding a generator is a host-side assignment, no device sync."""

    seed: int
    step: int = 0

    def __call__(self, purpose: int, device: torch.device | str) -> torch.Generator:
        generator = _generator(torch.device(device))
        generator.manual_seed(_mix(self.seed, self.step, purpose))
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
