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
    def forward(self, ids: list[int], last_only: bool = False, ancestry: torch.Tensor | None = None) -> torch.Tensor:
        """Append `ids` to the cache; return logits [len(ids), V] (or [1, V] if last_only).

        ancestry: [n, n] bool for a tree block (row r sees the rows it allows, and the whole
        cache); positions are then the cache length + each row's depth, so every row is
        computed exactly as in a sequential forward along its own path."""
        input_ids = torch.tensor([ids], dtype=torch.long)
        tree = {} if ancestry is None else self._tree_inputs(ancestry)
        out = self.model(
            input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0, **tree
        )
        return out.logits[0]

    def _tree_inputs(self, ancestry: torch.Tensor) -> dict:
        past, n = self.length, ancestry.shape[0]
        allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), ancestry], 1)  # [n, past + n]
        dtype = next(p.dtype for p in self.model.parameters() if p.is_floating_point())
        mask = torch.zeros(1, 1, n, past + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        depth = ancestry.sum(1) - 1  # ancestors including row 0, minus itself
        return {"attention_mask": mask, "position_ids": (past + depth)[None]}

    @torch.inference_mode()
    def keep(self, start: int, positions: list[int]) -> None:
        """Move the cache entries at `positions` to start, start+1, ... (a tree's accepted path)."""
        if not positions:
            return
        index = torch.tensor(positions)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)  # [batch, kv heads, length, head dim]
                tensor[:, :, start : start + len(positions)] = tensor[:, :, index]

    def crop(self, length: int) -> None:
        """Keep the cache of the first `length` tokens only."""
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5 takes the number of tokens to drop, negated
