"""The target's features (its last hidden states, normed: what its LM head reads), for heads
that draft from them (proposers) and for training them (train/features.py)."""

from __future__ import annotations

import torch


class FeatureTap:
    """Keeps the feature rows of a model's latest forward: [n, H], every row of the block even
    when only the last row's logits are computed (a prefill)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.rows: torch.Tensor | None = None
        self._hooked: torch.nn.Module | None = None

    def attach(self) -> None:
        """Hook the model's decoder stack (whose output feeds the LM head), once."""
        decoder = self.model.get_decoder()
        if decoder is not self._hooked:
            decoder.register_forward_hook(self._keep)
            self._hooked = decoder

    def _keep(self, module, inputs, output) -> None:
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        self.rows = hidden[0].detach()  # [n, H] of the batch's only sequence


def lm_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The target's LM head over guessed features [..., H] -> float32 logits [..., V]."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    dtype = weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else torch.float32
    return head(hidden.to(dtype)).float()
