"""The native forward's decoder stack in one call of specpipe's C kernel (CPU, fp16 and w8a32).

Where every linear layer of a `NativeLM` is on the C kernel (models/cpu_kernels.py), a forward's
30-odd layers run as one `sp_stack` call instead of ~20 torch ops a layer: norms, the fused
q/k/v projection, rotary, the cache write, attention, the output projection with its residual
add, the MLP. The step's Python work is the block's row table, built here from host ints.

Each block row carries where it writes and what it sees: its batch row, its cache slot, its
rotary position, and its visible slots as a prefix 0..p-1 plus, for a tree row, its path (the
block slots of its ancestors and itself, in depth order). A chain row at position p sees slots
0..p, as a one-token step at p does, and the kernel sums over them in that order: so every row
of a verify block, chain or tree, is bitwise the row a one-token forward computes, without
moving keys. This module is not a runner (native.py) and holds no weights of its own.
"""

from __future__ import annotations

import torch

from specpipe.engine.base import FINAL
from specpipe.models import cpu_kernels
from specpipe.models.linears import KernelLinear


class FusedStack:
    """`NativeLM.stack` on the C kernel, for a model whose linears are all `KernelLinear`s of one
    weight type (`of` says whether one can be built)."""

    def __init__(self, lm):
        layers = lm.layers
        self.type = layers[0].wqkv.kind
        self.hidden, self.heads, self.kv_heads, self.head_dim = lm.hidden_size, lm.heads, lm.kv_heads, lm.head_dim
        self.inter = layers[0].w_gate_up.out_features // 2
        self.eps = lm.eps
        self.norm = lm.norm.float().contiguous()
        self.cos, self.sin = lm.cos.float().contiguous(), lm.sin.float().contiguous()  # [max_len, D]
        self._keep = []  # the tensors whose addresses the table holds
        rows = []
        for layer in layers:
            row = []
            for linear in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
                row += [self._address(getattr(linear, name)) for name in cpu_kernels.LINEAR_POINTERS]
            row += [self._address(layer.norm1.float().contiguous()), self._address(layer.norm2.float().contiguous())]
            rows.append(row)
        self.table = torch.tensor(rows, dtype=torch.int64)  # [L, LAYER_COUNT]
        assert self.table.shape[1] == cpu_kernels.LAYER_COUNT

    @staticmethod
    def of(lm) -> "FusedStack | None":
        """A fused stack for `lm`, or None where its layer layout, weights or device are not the kernel's."""
        if not lm.llama_layout or lm.device.type != "cpu" or lm.dtype != torch.float32:  # the kernel's layer is Llama's
            return None
        linears = [linear for layer in lm.layers for linear in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
        if not linears or not all(isinstance(linear, KernelLinear) for linear in linears):
            return None
        if len({linear.kind for linear in linears}) != 1:
            return None
        return FusedStack(lm)

    def _address(self, tensor: torch.Tensor | None) -> int:
        if tensor is None:
            return 0
        self._keep.append(tensor)
        return tensor.data_ptr()

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor, starts: list[int], n: int, caches: list[torch.Tensor],
                 tree: list[list[int]] | None, hidden: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x [T = B·n, H] float32, the block's embeddings (overwritten); caches: `KVCache.layers`
        of rows 0..B-1; tree: each row's parents as host ints (a CPU tensor's, read for free) -> (the final norm's output [T, H], {layer: [B, n, H]})."""
        batch = len(starts)
        width, stride = caches[0].shape[2], caches[0].stride(0)
        if stride != 2 * self.kv_heads * width * self.head_dim or not caches[0][0].is_contiguous():
            raise ValueError("the fused stack needs each cache row contiguous ([2 kv heads, width, D])")
        rows, offsets, paths = _rows(starts, n, tree)
        taps = [index for index in hidden if index != FINAL]
        if any(not 0 <= index < len(caches) for index in taps):
            raise ValueError(f"hidden layers {taps} are not all among the model's {len(caches)} layers")
        out = {index: torch.empty(batch * n, self.hidden) for index in taps}
        dims = torch.tensor([self.type, self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter, width],
                            dtype=torch.int32)
        addresses = torch.tensor([cache.data_ptr() for cache in caches], dtype=torch.int64)
        tap_layers = torch.tensor(taps, dtype=torch.int32)
        tap_out = torch.tensor([out[index].data_ptr() for index in taps], dtype=torch.int64)
        failed = cpu_kernels.library().sp_stack(
            self.table.data_ptr(), addresses.data_ptr(), len(caches), dims.data_ptr(), self.eps, self.cos.data_ptr(),
            self.sin.data_ptr(), self.norm.data_ptr(), batch * n, x.data_ptr(), rows.data_ptr(),
            None if offsets is None else offsets.data_ptr(), None if paths is None else paths.data_ptr(),
            len(taps), tap_layers.data_ptr(), tap_out.data_ptr())
        if failed:
            raise MemoryError("specpipe's CPU kernel could not allocate its scratch space")
        kept = {index: tensor.view(batch, n, -1) for index, tensor in out.items()}
        if FINAL in hidden:
            kept[FINAL] = x.view(batch, n, -1)
        return x, kept


def _rows(starts: list[int], n: int, trees: list[list[int]] | None):
    """The kernel's row table: int32 [4, T] (batch row, cache slot, rotary position, visible
    prefix) and, for a tree (trees[b]: row b's parents), its paths as offsets [T + 1] and slots
    (None for a chain). A padding node (parent NO_NODE) hangs off row 0, as the mask has it."""
    batch = [b for b in range(len(starts)) for _ in range(n)]
    slots = [start + i for start in starts for i in range(n)]
    if trees is None:
        table = batch + slots + slots + [slot + 1 for slot in slots]
        return torch.tensor(table, dtype=torch.int32), None, None
    positions, paths, offsets = [], [], [0]
    for start, tree in zip(starts, trees):
        parent = [-1] + [max(p, -1) + 1 for p in tree]  # block row of each row's parent
        for i in range(n):  # ancestors-or-self, root first
            path = [i]
            while parent[path[-1]] >= 0:
                path.append(parent[path[-1]])
            positions.append(start + len(path) - 1)  # its depth: its ancestors, row 0 included
            paths += [start + r for r in path[::-1]]
            offsets.append(len(paths))
    prefixes = [start for start in starts for _ in range(n)]
    table = batch + slots + positions + prefixes
    return (torch.tensor(table, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32),
            torch.tensor(paths, dtype=torch.int32))
