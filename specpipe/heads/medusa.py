"""Medusa heads (Cai et al. 2024): K small heads on the target's last hidden state.

Head k (k = 1..K) guesses the token k+1 positions after the feature's token: the target's own
LM head already gives the next one. Each head is `num_layers` residual blocks
x <- x + SiLU(W x + b) followed by an LM head, by default the target's own (shared, so a head
costs H·H parameters per block instead of H·V). Blocks start at zero, so an untrained head
repeats the target's next-token guess. Parameter names follow vLLM's Medusa layout:
`blocks.{h}.layers.{l}.weight|bias`, `lm_heads.{h}.weight` when not shared.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class MedusaBlock(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 4, num_layers: int = 1,
                 shared_lm_head: bool = True):
        super().__init__()
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.blocks = nn.ModuleList(MedusaBlock(hidden_size, num_layers) for _ in range(num_heads))
        self.lm_heads = None if shared_lm_head else nn.ModuleList(
            nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))

    @property
    def shared_lm_head(self) -> bool:
        return self.lm_heads is None

    def forward(self, features: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                heads: int | None = None) -> torch.Tensor:
        """features [N, H] -> logits [K, N, V] of the first `heads` heads (all by default);
        lm_head: the target's LM head ([..., H] -> [..., V]; a runner's `lm_head`), when shared."""
        count = heads or self.num_heads
        dtype = self.blocks[0].layers[0].weight.dtype
        hidden = torch.stack([self.blocks[h](features.to(dtype)) for h in range(count)])  # [K, N, H]
        if self.lm_heads is None:  # one call of the shared head for all K: a K·N-row matmul
            return lm_head(hidden)
        return torch.stack([self.lm_heads[h](hidden[h]) for h in range(count)]).float()

