"""`LMRunner`: one causal LM and its KV cache, advanced a block of tokens at a time.

This is the only place that calls a Hugging Face model's forward during decoding. It knows
nothing about drafts or verdicts: callers feed token ids, read logits, and crop the cache back
to a prefix (the rollback after a rejected draft).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class LMRunner:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        """Tokens whose keys and values are in the cache."""
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Append `ids` to the cache; return logits [len(ids), V] (or [1, V] if last_only)."""
        input_ids = torch.tensor([ids], dtype=torch.long)
        out = self.model(
            input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0
        )
        return out.logits[0]

    def crop(self, length: int) -> None:
        """Keep the cache of the first `length` tokens only."""
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5 takes the number of tokens to drop, negated
