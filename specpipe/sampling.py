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
    """probs [..., V] -> token ids [...], drawn with the explicit generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=rng).reshape(probs.shape[:-1])
