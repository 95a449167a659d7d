"""`FeatureTap`: the target's features (its LM head's input) from its latest forward, for
heads that draft from them (proposers) and for training them (train/features.py)."""

from __future__ import annotations

import torch


class FeatureTap:
    """Keeps the input rows of a model's LM head from its latest forward: [n, H]."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.rows: torch.Tensor | None = None
        self._hooked: torch.nn.Module | None = None

    def attach(self) -> None:
        """(Re)attach to the current LM head: quantizing the target replaces the module."""
        head = self.model.get_output_embeddings()
        if head is not self._hooked:
            head.register_forward_pre_hook(self._keep)
            self._hooked = head

    def _keep(self, module, inputs) -> None:
        self.rows = inputs[0][0].detach()  # [n, H] of the batch's only sequence
