"""The target's logits as a head on its features reads them: its LM head's output, soft-capped
where the model caps its logits.

A head scores tokens through the target's LM head (Medusa's shared head, EAGLE's, DFlash's) or
through some rows of it (a draft vocabulary: `Runner.lm_head_weight()[ids]`). Where a config sets
`final_logit_softcapping` (Gemma 2's do; Gemma 3's may), the model's logits are
`cap · tanh(h·Wᵀ / cap)`, not `h·Wᵀ`: a weight cannot carry the tanh, so whoever scores with the
rows applies it. `final_softcap` reads the cap from a config (a multimodal config's text part
included), `softcap` applies it, `CappedRows` keeps it beside a head's rows so that rows and the
whole head give the same logits. The cap is monotone: greedy choices and top-k sets are the same
either way; the probabilities (sampled drafts, a tree's scores) are the model's only with it.

This module holds no weights of its own and loads nothing.
"""

from __future__ import annotations

import torch
from torch import nn


def final_softcap(config) -> float | None:
    """The cap a model's config puts on its final logits (None: uncapped)."""
    for part in (config, getattr(config, "text_config", None)):
        cap = getattr(part, "final_logit_softcapping", None) if part is not None else None
        if cap:
            return float(cap)
    return None


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap · tanh(logits / cap), or the logits where `cap` is None (a new tensor either way for a cap)."""
    if cap is None:
        return logits
    return torch.tanh(logits / cap).mul_(cap)


class CappedRows(nn.Module):
    """Rows of the target's LM head (a Linear H -> K in any precision's kernel) scoring as the
    model does: float32 logits [..., K], soft-capped by `cap` where the model caps its own."""

    def __init__(self, rows: nn.Module, cap: float | None):
        super().__init__()
        self.rows, self.cap = rows, cap

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return softcap(self.rows(hidden).float(), self.cap)
