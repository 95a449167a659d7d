"""The runner interface: one causal LM and its KV cache, advanced a block of tokens at a time.

Two implementations sit behind it (`engine=native`: specpipe's own forward for the Llama and
Qwen2 families; `engine=hf`: any transformers architecture); nothing above it knows which one
runs. A runner knows nothing about drafts or verdicts: callers feed token ids and get a
`TargetOutput` back, crop the cache to a prefix (the rollback after a rejected draft) and move
a tree's accepted path into place (`keep`).

Hidden-state keys (what a proposer may declare in `hidden_layers`): `i` in 0..L-1 is the
residual stream after decoder layer i; `FINAL` (-1) is the final norm's output, the LM head's
input (what Medusa and EAGLE heads read).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

FINAL = -1  # hidden-state key of the LM head's input


@dataclass(frozen=True)
class TargetOutput:
    """What one forward computed. logits: [B, n, V] float32 (n = 1 for a `last_only` forward);
    hidden: {layer key: [B, n_block, H] float32}, every row of the block, for the keys asked.
    (float64 models give float64.)"""

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)

    def row(self, b: int) -> "TargetOutput":
        """Batch row b alone, as a single-sequence forward returns it ([1, n, ...])."""
        return TargetOutput(self.logits[b : b + 1], {key: value[b : b + 1] for key, value in self.hidden.items()})


@dataclass(frozen=True)
class Memory:
    """Bytes a runner holds: its weights and its KV cache (allocated, not just used)."""

    weights: int
    cache: int


class Runner(ABC):
    engine: str  # "native" or "hf"
    precision: str  # a mode of specpipe/models/quantize.py
    vocab_size: int
    hidden_size: int
    num_layers: int

    @property
    @abstractmethod
    def length(self) -> int:
        """Tokens whose keys and values are in the cache."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached token (a new generation)."""

    @abstractmethod
    def forward(self, ids: list[int], *, last_only: bool = False, ancestry: torch.Tensor | None = None,
                hidden: tuple[int, ...] = ()) -> TargetOutput:
        """Append `ids` to the cache; logits [1, len(ids), V] (or [1, 1, V] if last_only).

        ancestry: [n, n] bool for a tree block (row r sees the rows it allows, and the whole
        cache); row positions are then the cache length + each row's depth, so every row is
        computed exactly as in a sequential forward along its own path."""

    @abstractmethod
    def keep(self, start: int, slots: list[int]) -> None:
        """Move the cache entries at `slots` to start, start+1, ... (a tree's accepted path)."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Keep the cache of the first `length` tokens only."""

    @abstractmethod
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's LM head over features [..., H] -> float32 logits [..., V]."""

    @abstractmethod
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [...] -> float32 [..., H] (what an EAGLE head reads with features)."""

    @abstractmethod
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight [V, H] as float32 (a head's draft vocabulary rows come from it)."""

    @abstractmethod
    def memory(self) -> Memory:
        """Weight and KV cache bytes."""


def wide(t: torch.Tensor) -> torch.Tensor:
    """float32, or float64 where it already is (tests demand exact equality on float64 models)."""
    return t if t.dtype == torch.float64 else t.float()


def tree_depths(ancestry: torch.Tensor) -> torch.Tensor:
    """[n] int64 depth of each block row: ancestors including row 0, minus itself."""
    return ancestry.sum(1) - 1
