"""The native forward for decoder-only LMs (Llama, SmolLM2, Qwen2/3, Mistral, Gemma 3, Phi-3,
Granite, OLMo 2, Qwen3-MoE), gpt-fast style.

What differs between those families is data (native_families.py: a `Spec` per model, read from
its config); this module runs it, over the cache and attention parts of native_attention.py.
Weights are taken once from a loaded transformers model and re-laid for decoding: q, k, v fused
into one projection and gate, up into another, in the precision's kernel
(specpipe/models/quantize.py), constant factors folded in; RMSNorm is `F.rms_norm`; rotary is
one op over q and k together, read from tables built by the model's own rotary module (so every
static rope scaling transformers knows comes for free; one table per layer type where a family
has several). A forward takes a batch [B, n] with per-row cache slots and positions, writes its
keys and values into a preallocated cache (`KVCache`) and attends over it through a boolean
mask: row (b, i) sees slot j if j is before row b's block or is an ancestor-or-self of row i
inside it, and, in a sliding-window layer, holds a position within the window. So a rollback is
a length, a tree's accepted path is a gather, and stale slots past a row's length are never
seen. In the exact precisions a verify block attends one query row at a time instead
(`_attend_rows`; a tree's path laid out in the block's slots as it goes), so that each row is
computed bit for bit as a one-token forward would compute it.

This module is not a runner (see native.py) and does not load files: it reads the nn.Module.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from specpipe.drafts import block_ancestry, block_depths
from specpipe.engine.base import FINAL, wide
from specpipe.engine.native_attention import (KVCache, _attend_rows, _mask, _rope_tables, _rotate, _row_keys,
                                              host_parents, key_positions)
from specpipe.engine.native_experts import Experts
from specpipe.engine.native_families import FAMILIES as LAYOUTS
from specpipe.engine.native_families import (STATIC_ROPE, LayerWeights, architecture_of, norm_weight, read_layer,
                                             spec_of)
from specpipe.engine.native_fused import FusedStack
from specpipe.heads.logits import softcap
from specpipe.models.quantize import EXACT, activation_dtype, dense_weight, linear_kernel, move_kernel, on_kernel

__all__ = ["FAMILIES", "STATIC_ROPE", "KVCache", "NativeLM", "config_unsupported_reason", "unsupported_reason"]

EXACT_BLOCK = 32  # exact precisions attend row by row in blocks up to this size (verify blocks; a long prefill is batched)
FAMILIES = tuple(LAYOUTS)  # the architectures the native forward runs (native_families.py)
HEAD_MODE = {"w4a8": "w8a8"}  # the LM head's precision where it is not the layers' own
ACTIVATION = {"silu": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"), "gelu": F.gelu}


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the native engine cannot run `model`, or None if it can."""
    return config_unsupported_reason(model.config, type(model).__name__)


def config_unsupported_reason(config, architecture: str | None = None) -> str | None:
    """The same from a model's config alone (`specpipe check` loads no weights)."""
    spec = spec_of(config, architecture)
    return spec if isinstance(spec, str) else None


def native_family(config, architecture: str | None = None) -> str | None:
    """The architecture the native forward runs this config as, or None where it falls back."""
    return None if isinstance(spec_of(config, architecture), str) else architecture_of(config, architecture)


class _Layer:
    """One decoder layer's kernels and small tensors. norm1, norm2: the norms before attention and
    before the MLP; post1, post2: after them (None where the family has none); qk_norm: q's and
    k's norm weights side by side; window: its sliding window (None: global); rope: its slice
    of the rotary tables laid side by side (None: the one table)."""

    def __init__(self, weights: LayerWeights, mode: str, dtype: torch.dtype, window: int | None, rope: slice | None,
                 act):
        w = weights
        self.wqkv = linear_kernel(w.qkv, w.qkv_bias, mode, dtype)
        self.wo = linear_kernel(w.o, w.o_bias, mode, dtype)
        self.experts = None if w.experts is None else Experts(
            w.experts.router, w.experts.gate_up, w.experts.down, w.experts.top_k, w.experts.normalize, mode,
            HEAD_MODE.get(mode, mode), dtype, act)  # the router's rows pick experts: 8 bits at least, as the head's
        self.w_gate_up = None if w.gate_up is None else linear_kernel(w.gate_up, w.gate_up_bias, mode, dtype)
        self.w_down = None if w.down is None else linear_kernel(w.down, w.down_bias, mode, dtype)
        self.norm1, self.post1, self.norm2, self.post2 = (None if t is None else t.to(dtype) for t in w.norms)
        self.qk_norm = None if w.qk_norm is None else w.qk_norm.to(dtype)
        self.window, self.rope = window, rope

    def kernels(self) -> list[torch.nn.Module]:
        """Every linear kernel of the layer (a sparse block's router and experts included)."""
        dense = [m for m in (self.wqkv, self.wo, self.w_gate_up, self.w_down) if m is not None]
        return dense + ([] if self.experts is None else self.experts.kernels())


class NativeLM:
    """The forward of one decoder-only LM, its weights in precision `mode`."""

    def __init__(self, model: torch.nn.Module, mode: str, max_len: int, device: str = "cpu"):
        spec = spec_of(model.config, type(model).__name__)
        if isinstance(spec, str):
            raise ValueError(f"the native engine cannot run this model: {spec}")
        config, decoder = model.config, model.get_decoder()
        base = decoder.embed_tokens.weight.dtype
        self.spec = spec
        self.mode, self.dtype, self.device = mode, activation_dtype(mode, base), torch.device(device)
        self.hidden_size, self.vocab_size = config.hidden_size, config.vocab_size
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.act = ACTIVATION[spec.activation]
        self.softcap = spec.softcap
        self.windows = tuple(dict.fromkeys(spec.windows))  # the distinct windows: one attention mask each
        # cos, signed sin [max_len, kinds · R]: one table of R rotary dims per layer type, side by side
        tables = [_rope_tables(decoder.rotary_emb, max_len, self.head_dim, base, self.dtype, kind) for kind in spec.kinds]
        self.cos, self.sin = (torch.cat(t, -1) if len(t) > 1 else t[0] for t in zip(*tables))
        self.rotary_dim = tables[0][0].shape[-1]  # R: D, or fewer (a partial rotary factor)
        self.layers = [_Layer(read_layer(layer, spec, self.heads, self.kv_heads, self.head_dim), mode, self.dtype,
                              window, self._rope_slice(spec.kinds.index(kind)), self.act)
                       for layer, window, kind in zip(decoder.layers, spec.windows, spec.ropes)]
        embedding = decoder.embed_tokens.weight.detach()
        if spec.embed_scale != 1.0:  # folded in: a scaled row is what every layer and head reads
            embedding = embedding * torch.tensor(spec.embed_scale, dtype=embedding.dtype)
        # fp16 storage where the weights are fp16 or int8: an embedding row is read, not multiplied
        table = torch.float16 if mode in ("fp16", "int8") else self.dtype
        self.embedding = embedding.to(table)
        self.norm = norm_weight(decoder.norm, spec).to(self.dtype)
        head = model.get_output_embeddings()
        head_weight = dense_weight(head, _float(head))
        if spec.logit_scale != 1.0:
            head_weight = head_weight * spec.logit_scale
        # 4-bit weights keep an 8-bit LM head (as llama.cpp's Q4 files keep theirs at 6 bits or more):
        # the logits are what a greedy step compares
        self.head = linear_kernel(head_weight, None, HEAD_MODE.get(mode, mode), self.dtype)
        self.max_len = max_len
        if self.device.type != "cpu":
            self._to_device()
        # the torch forward attends row by row where the linears are bitwise too: the exact precisions,
        # and the C kernel's when its fused stack does not run (compile=true, static steps)
        self.exact = mode in EXACT or on_kernel(mode)
        # the C kernel's fused stack implements Llama's layer only: other layouts run the torch stack
        self.llama_layout = (spec.llama_layout and self.rotary_dim == self.head_dim
                             and all(layer.experts is None for layer in self.layers))
        self.fused = FusedStack.of(self)  # the stack in one C call a forward, where the weights are on the kernel

    def _rope_slice(self, kind: int) -> slice | None:
        """A layer type's columns of the side-by-side rotary tables (None: the one table, whole)."""
        if len(self.spec.kinds) == 1:
            return None
        return slice(kind * self.rotary_dim, (kind + 1) * self.rotary_dim)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, batch: int, capacity: int, spare: int = 0) -> KVCache:
        return KVCache(self.num_layers, batch, self.kv_heads, min(capacity, self.max_len), self.head_dim,
                       self.dtype, self.device, spare)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids].to(self.dtype)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> logits [..., V] (float32 or wider)."""
        return self._capped(wide(self.head(hidden.to(self.dtype))))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] contiguous, the final norm's output -> logits [T, V] (float32 or wider)."""
        return self._capped(wide(self.head.matmul(x)))

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """cap · tanh(logits / cap) where the model soft-caps its logits (Gemma), else the logits:
        the forward's logits and `lm_head` (what heads score the target's features with) alike."""
        return softcap(logits, self.softcap)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, starts: list[int], cache: KVCache, tree: torch.Tensor | None = None,
                hidden: tuple[int, ...] = (), last_only: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids [B, n] written at cache slots starts[b] + 0..n-1 (starts: host ints, so no width is
        read back from the device); tree: a tree block's parents [B, n - 1] (drafts.py; None:
        causal), each row at position start + its depth, its mask and positions built from them
        on the device. -> (logits [B, n or 1, V] float32, {key: [B, n, H]})."""
        batch, n = ids.shape
        if self.fused is not None:  # the whole stack in one kernel call (native_fused.py): the CPU's
            x, out = self.fused(self.embed(ids.reshape(-1)), starts, n, cache.layers, host_parents(tree), hidden)
            last = x.view(batch, n, -1)[:, -1].contiguous() if last_only else x
            return self.logits(last).view(batch, 1 if last_only else n, -1), out
        device = ids.device
        width = max(starts) + n  # slots any row may see
        start = torch.tensor(starts, dtype=torch.long).to(device, non_blocking=True)  # [B]
        if tree is None:
            offsets = torch.arange(n, device=device)[None]  # [1, n]: each block row's position past its row's start
            ancestry = None
        else:
            offsets = block_depths(tree).to(device, non_blocking=True)  # [B, n]
            ancestry = block_ancestry(tree).to(device, non_blocking=True)  # [B, n, n]
        positions = start[:, None] + offsets
        # the exact row attention lays a tree's rows out by host ints: read where the parents are
        # on the CPU (free); a GPU's tree attends through the mask instead (no sync)
        exact_rows = self.exact and n <= EXACT_BLOCK and (tree is None or tree.device.type == "cpu")
        row_keys = _row_keys(starts, n, host_parents(tree)) if exact_rows else None
        mask = keys = None
        if row_keys is None:
            windowed = any(window is not None for window in self.windows)
            keys = key_positions(start, offsets, width) if tree is not None and windowed else None
            mask = _mask(start, n, width, ancestry)
        slots = start[:, None] + torch.arange(n, device=device)  # [B, n]
        x, out = self.decode(ids, positions, slots, mask, keys, cache.layers, hidden,
                             None if row_keys is None else (row_keys, starts))
        x = x.view(batch, n, -1)
        last = x[:, -1] if last_only else x.reshape(batch * n, -1)
        return self.logits(last.contiguous()).view(batch, 1 if last_only else n, -1), out

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None,
               keys: torch.Tensor | None, caches: list[torch.Tensor], hidden: tuple[int, ...],
               rows: tuple | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The torch body of a forward, which the eager forward and a static step (static.py:
        captured as a CUDA graph, or run as it is on the CPU) both run: ids, positions, slots [B, n];
        mask bool [B, 1, n, width] (None: `rows`' exact attention, see `stack`); keys: each
        slot's position [B, width] (None: its index) -> (normed x [B·n, H], {key: [B, n, H]})."""
        batch, n = positions.shape
        table = positions.clamp(max=self.max_len - 1).view(-1)  # a static step's padding rows may run past the table
        cos, sin = self.cos[table].view(batch * n, 1, -1), self.sin[table].view(batch * n, 1, -1)
        bias = None if mask is None else self.biases(mask, positions, keys)
        x = self.embed(ids.reshape(-1))  # [T = B·n, H]: every Linear sees all rows at once
        return self.stack(x, cos, sin, bias, slots, caches, hidden, rows)

    def biases(self, mask: torch.Tensor, positions: torch.Tensor,
               keys: torch.Tensor | None = None) -> dict[int | None, torch.Tensor]:
        """bool [B, 1, n, width] (slot j visible to block row i), the rows' positions [B, n] and
        each slot's position [B, width] (None: the slot's own index, as in a chain) -> {window:
        the additive mask `stack` takes}, one per distinct window of the model's layers (None: global)."""
        out = {}
        for window in self.windows:
            seen = mask
            if window is not None:  # transformers' sliding window: key position > query position - window
                at = torch.arange(mask.shape[-1], device=mask.device)[None] if keys is None else keys
                seen = mask & (at[:, None, :] > positions[:, :, None] - window)[:, None]
            out[window] = self.additive(seen)
        return out

    def additive(self, mask: torch.Tensor) -> torch.Tensor:
        """bool [B, 1, n, width] (slot j visible to block row i) -> the [B, 1, group * n, width]
        additive mask `stack` takes, queries grouped per kv head, built once for all layers."""
        mask = mask.repeat(1, 1, self.heads // self.kv_heads, 1)
        return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))

    def stack(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: dict | None, slots: torch.Tensor,
              caches: list[torch.Tensor], hidden: tuple[int, ...], rows: tuple | None = None):
        """The decoder layers and the final norm: x [T, H] -> (normed x [T, H], {key: [B, n, H]}).
        x is the residual stream, updated in place (each layer's output projections add into it
        inside their GEMMs: see `matmul_add`), so the caller passes a tensor of its own. caches:
        `KVCache.layers`, [B, 2 · kv heads, width, D] each. bias: `biases`' masks by window.
        Its inputs are tensors of fixed rank, so `torch.compile` captures it whole (compile.py).
        rows: (row_keys, starts): per batch row, the order its block rows attend in and the slots
        each sees (see `_row_keys`; None: one masked call), and the block's first slot per row
        (host ints), for attention computed row by row as one-token forwards do (exact modes)."""
        batch, n = slots.shape
        row_keys, starts = rows if rows is not None else (None, None)  # noqa: F841 (starts: exact rows only)
        group = self.heads // self.kv_heads
        q_width = self.heads * self.head_dim
        rows = torch.arange(batch, device=x.device)[:, None]
        out: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            h = x if layer.norm1 is None else F.rms_norm(x, (self.hidden_size,), layer.norm1, self.eps)
            # [T, heads + 2 kv heads, D]: q, k, v; q and k normed and rotated in place, so k and v stay side by side
            qkv = layer.wqkv.matmul(h).view(batch * n, self.heads + 2 * self.kv_heads, self.head_dim)
            qk = qkv[:, : self.heads + self.kv_heads]
            if layer.qk_norm is not None:
                self._norm_qk(qk, layer.qk_norm)
            self._rotary(qk, cos, sin, layer.rope)
            cache = caches[index]  # [B, 2 kv heads, width, D]: keys, then values
            k_cache, v_cache = cache[:, : self.kv_heads], cache[:, self.kv_heads :]
            kv = qkv[:, self.heads :].view(batch, n, 2 * self.kv_heads, self.head_dim)
            if batch == 1:  # one run of slots: one copy along the slot axis, keys and values
                cache.index_copy_(2, slots[0], kv.transpose(1, 2))
            else:
                cache[rows, :, slots] = kv
            k, v = kv[:, :, : self.kv_heads], kv[:, :, self.kv_heads :]  # [B, n, kv heads, D]
            # [B, kv heads, group * n, D]: every query head of one kv head attends in one call
            q = qkv[:, : self.heads].reshape(batch, n, self.kv_heads, group, self.head_dim).permute(0, 2, 3, 1, 4)
            if row_keys is None:
                mask = bias[layer.window]
                width = mask.shape[-1]
                att = F.scaled_dot_product_attention(q.reshape(batch, self.kv_heads, group * n, self.head_dim),
                                                     k_cache[:, :, :width], v_cache[:, :, :width], attn_mask=mask)
                att = att.view(batch, self.kv_heads, group, n, self.head_dim).permute(0, 3, 1, 2, 4)
            else:  # [B, n, kv heads, group, D]
                att = _attend_rows(q, k, v, k_cache, v_cache, starts, row_keys, layer.window)
            x = self._residual(layer.wo, att.reshape(batch * n, q_width), x, layer.post1)
            h = x if layer.norm2 is None else F.rms_norm(x, (self.hidden_size,), layer.norm2, self.eps)
            if layer.experts is not None:  # a sparse block: its experts' sum, added as a branch
                x = x.add_(layer.experts(h) if layer.post2 is None else
                           F.rms_norm(layer.experts(h), (self.hidden_size,), layer.post2, self.eps))
            else:
                gate, up = layer.w_gate_up.matmul(h).chunk(2, -1)
                x = self._residual(layer.w_down, self.act(gate) * up, x, layer.post2)
            if index in hidden:  # a copy: the next layers add into x in place
                kept = wide(x)
                out[index] = (kept.clone() if kept is x else kept).view(batch, n, -1)
        x = F.rms_norm(x, (self.hidden_size,), self.norm, self.eps)
        if FINAL in hidden:
            out[FINAL] = wide(x).view(batch, n, -1)
        return x, out

    def _norm_qk(self, qk: torch.Tensor, weight: torch.Tensor) -> None:
        """q's and k's RMS norms, in place in qk [T, heads + kv heads, D]: per head (weight
        [heads + kv heads, D], both in one call) or over all of q's heads and all of k's (weight
        [(heads + kv heads) · D], one call each)."""
        if weight.dim() == 2:
            qk.copy_(F.rms_norm(qk, (self.head_dim,), None, self.eps).mul_(weight))
            return
        for part, w in zip(qk.split((self.heads, self.kv_heads), 1), weight.split((self.heads * self.head_dim,
                                                                                  self.kv_heads * self.head_dim))):
            flat = part.reshape(part.shape[0], -1)  # [T, heads · D]
            part.copy_(F.rms_norm(flat, (flat.shape[-1],), w, self.eps).view_as(part))

    def _rotary(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: slice | None) -> None:
        """Rotate qk [T, heads + kv heads, D] in place by the layer's table (cos, sin [T, 1, kinds · R])."""
        if rope is not None:
            cos, sin = cos[..., rope], sin[..., rope]
        if self.rotary_dim == self.head_dim:
            _rotate(qk, cos, sin)
            return
        # a partial rotary factor: the first R dims rotate, on a contiguous copy (an elementwise
        # kernel over the strided slice picked another loop at 5 rows or more, and other bits)
        part = qk[..., : self.rotary_dim].contiguous()
        _rotate(part, cos, sin)
        qk[..., : self.rotary_dim] = part

    def _residual(self, linear, h: torch.Tensor, x: torch.Tensor, post: torch.Tensor | None) -> torch.Tensor:
        """x += linear(h), normed first where the family norms a branch's output (post-norms)."""
        if post is None:
            return linear.matmul_add(h, x)
        return x.add_(F.rms_norm(linear.matmul(h), (self.hidden_size,), post, self.eps))

    def _to_device(self) -> None:
        """Move every tensor and kernel to the device (fbgemm kernels are CPU-only: refused)."""
        for owner in [self, *self.layers]:
            for name, value in list(vars(owner).items()):
                if isinstance(value, torch.Tensor):
                    setattr(owner, name, value.to(self.device))
                elif isinstance(value, torch.nn.Module):
                    setattr(owner, name, move_kernel(value, self.device))
                elif isinstance(value, Experts):
                    value.to(self.device)


def _float(module: torch.nn.Module) -> torch.dtype:
    """A module's weight dtype if it is a wide float (float64 stays float64), else float32."""
    weight = getattr(module, "weight", None)
    return torch.float64 if isinstance(weight, torch.Tensor) and weight.dtype == torch.float64 else torch.float32
