"""A mixture-of-experts MLP for the native forward (Qwen3-MoE's sparse block): top-k routing,
each expert run once a step over the rows routed to it.

The router is a linear layer in the precision's kernel, so in the exact precisions its logits
for a row do not depend on the other rows of the call: a verify row picks the experts its
one-token step picks. Each expert's gate/up and down projections are kernels of their own;
an expert's output for a row is weighted by the row's routing weight and added into the output
in expert order, whatever the rows around it, so the sum is the same bits in a verify block and
in a one-token step.

Two ways to run the experts, equal bit for bit in the exact precisions (an expert's linear
computes a row the same whatever rows it is called with, and an unrouted expert adds a weight
of exactly 0):
- sparse (CPU): the routed experts only, each over the rows routed to it (which experts and rows
  are read back to the host: a CPU computes as it is asked, nothing to wait for);
- dense (any other device, and under torch.compile): every expert over every row, weighted by 0
  where a row is not routed to it: no read back, static shapes, so a step can be captured as a
  CUDA graph (or compiled as one graph), at E / k times the experts' arithmetic (a grouped GEMM
  is what would avoid it).

This module holds no attention and reads no files: native_families.py reads the weights.
"""

from __future__ import annotations

import torch

from specpipe.models.quantize import linear_kernel, move_kernel


class Experts:
    """One sparse MLP block: router [E, H], experts' gate/up [E, 2I, H] and down [E, H, I]."""

    def __init__(self, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int, normalize: bool,
                 mode: str, router_mode: str, dtype: torch.dtype, act):
        self.router = linear_kernel(router, None, router_mode, dtype)
        self.gate_up = [linear_kernel(w, None, mode, dtype) for w in gate_up]
        self.down = [linear_kernel(w, None, mode, dtype) for w in down]
        self.top_k, self.normalize, self.act = top_k, normalize, act

    def kernels(self) -> list[torch.nn.Module]:
        return [self.router, *self.gate_up, *self.down]

    def to(self, device: torch.device) -> "Experts":
        self.router = move_kernel(self.router, device)
        self.gate_up = [move_kernel(m, device) for m in self.gate_up]
        self.down = [move_kernel(m, device) for m in self.down]
        return self

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H], the normed residual -> the block's output [T, H] (in h's dtype)."""
        weights = self.route(h)  # [T, E]: each row's weight per expert, 0 where not routed
        out = torch.zeros_like(h)
        if h.device.type == "cpu" and not torch.compiler.is_compiling():  # compile=true: one graph, no reads
            routed = weights.ne(0)
            for expert in routed.any(0).nonzero()[:, 0].tolist():  # ascending: the same order for every row
                rows = routed[:, expert].nonzero()[:, 0]
                out.index_add_(0, rows, self._expert(expert, h[rows]) * weights[rows, expert, None])
        else:
            for expert in range(len(self.gate_up)):
                out.add_(self._expert(expert, h) * weights[:, expert, None])
        return out

    def route(self, h: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, E] routing weights: the top k experts' softmax probabilities (renormalized
        over the k where the model says so), in the router's dtype as transformers rounds them."""
        logits = self.router.matmul(h)  # [T, E]
        probs = torch.softmax(logits, -1, dtype=torch.float32)
        top, index = probs.topk(self.top_k, -1)  # [T, k]
        if self.normalize:
            top = top / top.sum(-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(1, index, top.to(logits.dtype))

    def _expert(self, expert: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up[expert].matmul(h.contiguous()).chunk(2, -1)
        return self.down[expert].matmul(self.act(gate) * up)
