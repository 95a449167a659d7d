"""The native forward for Llama-family decoders (Llama, SmolLM2, Qwen2), gpt-fast style.

Weights are taken once from a loaded transformers model and re-laid for decoding: q, k, v fused
into one projection and gate, up into another, in the precision's kernel
(specpipe/models/quantize.py); RMSNorm is `F.rms_norm`; rotary is one op over q and k together,
read from a table built by the model's own rotary module (so every static rope scaling
transformers knows comes for free). A forward takes a batch [B, n] with per-row cache slots
and positions, writes its keys and values into a preallocated cache (`KVCache`) and attends
over it through a boolean mask: row (b, i) sees slot j if j is before row b's block or is an
ancestor-or-self of row i inside it. So a rollback is a length, a tree's accepted path is a
gather, and stale slots past a row's length are never seen.

This module is not a runner (see native.py) and does not load files: it reads the nn.Module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpipe.engine.base import FINAL, wide
from specpipe.models.quantize import activation_dtype, dense_bias, dense_weight, linear_kernel, move_kernel

STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # tables that do not depend on the sequence length
FAMILIES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the native engine cannot run `model`, or None if it can."""
    name = type(model).__name__
    if name not in FAMILIES:
        return f"{name} is not a native architecture (native: {', '.join(FAMILIES)})"
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act} (native: silu)"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    rope = getattr(model.get_decoder().rotary_emb, "rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"rope scaling {rope!r} depends on the sequence length (native: {', '.join(STATIC_ROPE)})"
    return None


class KVCache:
    """Keys and values of every layer, preallocated: [layers, B, kv heads, capacity, head dim]."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class _Layer:
    def __init__(self, layer: torch.nn.Module, mode: str, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        weight = lambda m: dense_weight(m, _float(m))  # noqa: E731 (float64 tiny models stay float64)
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.wqkv = linear_kernel(torch.cat([weight(m) for m in qkv]), _cat_bias(qkv), mode, dtype)
        self.wo = linear_kernel(weight(attn.o_proj), dense_bias(attn.o_proj), mode, dtype)
        gate_up = [mlp.gate_proj, mlp.up_proj]
        self.w_gate_up = linear_kernel(torch.cat([weight(m) for m in gate_up]), _cat_bias(gate_up), mode, dtype)
        self.w_down = linear_kernel(weight(mlp.down_proj), dense_bias(mlp.down_proj), mode, dtype)
        self.norm1 = layer.input_layernorm.weight.detach().to(dtype)
        self.norm2 = layer.post_attention_layernorm.weight.detach().to(dtype)


class NativeLM:
    """The forward of one decoder-only LM, its weights in precision `mode`."""

    def __init__(self, model: torch.nn.Module, mode: str, max_len: int, device: str = "cpu"):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the native engine cannot run this model: {reason}")
        config, decoder = model.config, model.get_decoder()
        base = decoder.embed_tokens.weight.dtype
        self.mode, self.dtype, self.device = mode, activation_dtype(mode, base), torch.device(device)
        self.hidden_size, self.vocab_size = config.hidden_size, config.vocab_size
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.layers = [_Layer(layer, mode, self.dtype) for layer in decoder.layers]
        # fp16 storage where the weights are fp16 or int8: an embedding row is read, not multiplied
        table = torch.float16 if mode in ("fp16", "int8") else self.dtype
        self.embedding = decoder.embed_tokens.weight.detach().to(table)
        self.norm = decoder.norm.weight.detach().to(self.dtype)
        head = model.get_output_embeddings()
        self.head = linear_kernel(dense_weight(head, _float(head)), None, mode, self.dtype)
        self.cos, self.sin = _rope_tables(decoder.rotary_emb, max_len, self.head_dim, base)  # [max_len, D]
        self.max_len = max_len
        if self.device.type != "cpu":
            self._to_device()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache(self.num_layers, batch, self.kv_heads, min(capacity, self.max_len), self.head_dim,
                       self.dtype, self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids].to(self.dtype)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return wide(self.head(hidden.to(self.dtype)))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                ancestry: torch.Tensor | None = None, hidden: tuple[int, ...] = (),
                last_only: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids [B, n] written at cache slots start[b] + 0..n-1, rotary positions [B, n];
        ancestry [n, n] bool (None: causal). -> (logits [B, n or 1, V] float32, {key: [B, n, H]})."""
        batch, n = ids.shape
        slots = start[:, None] + torch.arange(n, device=ids.device)  # [B, n]
        width = int(start.max()) + n  # slots any row may see
        mask = _mask(start, n, width, ancestry)  # [B, 1, n, width] bool
        group = self.heads // self.kv_heads
        mask = mask.repeat(1, 1, group, 1)  # [B, 1, group * n, width]: queries grouped per kv head
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [B, n, 1, D]
        rows = torch.arange(batch, device=ids.device)[:, None]
        x = self.embed(ids)  # [B, n, H]
        out: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (self.hidden_size,), layer.norm1, self.eps)
            qkv = layer.wqkv(h)  # [B, n, (heads + 2 kv heads) * D]
            qk, v = qkv.split([(self.heads + self.kv_heads) * self.head_dim, self.kv_heads * self.head_dim], -1)
            qk = _rotate(qk.view(batch, n, self.heads + self.kv_heads, self.head_dim), cos, sin).to(self.dtype)
            q, k = qk.split([self.heads, self.kv_heads], 2)  # [B, n, heads, D], [B, n, kv heads, D]
            cache.k[index][rows, :, slots] = k
            cache.v[index][rows, :, slots] = v.view(batch, n, self.kv_heads, self.head_dim)
            # [B, kv heads, group * n, D]: every query head of one kv head attends in one call
            q = q.view(batch, n, self.kv_heads, group, self.head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(batch, self.kv_heads, group * n, self.head_dim)
            att = F.scaled_dot_product_attention(q, cache.k[index][:, :, :width], cache.v[index][:, :, :width],
                                                 attn_mask=mask)
            att = att.view(batch, self.kv_heads, group, n, self.head_dim).permute(0, 3, 1, 2, 4)
            x = x + layer.wo(att.reshape(batch, n, self.heads * self.head_dim))
            h = F.rms_norm(x, (self.hidden_size,), layer.norm2, self.eps)
            gate, up = layer.w_gate_up(h).chunk(2, -1)
            x = x + layer.w_down(F.silu(gate) * up)
            if index in hidden:
                out[index] = wide(x)
        x = F.rms_norm(x, (self.hidden_size,), self.norm, self.eps)
        if FINAL in hidden:
            out[FINAL] = wide(x)
        return self.lm_head(x[:, -1:] if last_only else x), out

    def _to_device(self) -> None:
        """Move every tensor and kernel to the device (fbgemm kernels are CPU-only: refused)."""
        for owner in [self, *self.layers]:
            for name, value in list(vars(owner).items()):
                if isinstance(value, torch.Tensor):
                    setattr(owner, name, value.to(self.device))
                elif isinstance(value, torch.nn.Module):
                    setattr(owner, name, move_kernel(value, self.device))


def _mask(start: torch.Tensor, n: int, width: int, ancestry: torch.Tensor | None) -> torch.Tensor:
    """[B, 1, n, width] bool: slot j is visible to block row i of row b."""
    block = torch.ones(n, n, dtype=torch.bool, device=start.device).tril() if ancestry is None else ancestry.to(start.device)
    column = torch.arange(width, device=start.device)[None, :] - start[:, None]  # [B, width]: slot - block start
    before = column < 0
    inside = (column >= 0) & (column < n)
    in_block = block[:, column.clamp(0, n - 1)].permute(1, 0, 2)  # [B, n, width]
    return (before[:, None] | (inside[:, None] & in_block))[:, None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form, in the tables' dtype: float32 or wider) of x [B, n, heads, D]."""
    x = x.to(cos.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _rope_tables(rotary: torch.nn.Module, length: int, head_dim: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(dtype, torch.float32)
    with torch.no_grad():  # [1, length, D], the model's attention scaling included
        cos, sin = rotary(torch.zeros(1, 1, head_dim, dtype=dtype), torch.arange(length)[None])
    return cos[0].to(dtype), sin[0].to(dtype)


def _float(module: torch.nn.Module) -> torch.dtype:
    """A module's weight dtype if it is a wide float (float64 stays float64), else float32."""
    weight = getattr(module, "weight", None)
    return torch.float64 if isinstance(weight, torch.Tensor) and weight.dtype == torch.float64 else torch.float32


def _cat_bias(linears: list[torch.nn.Module]) -> torch.Tensor | None:
    biases = [dense_bias(m) for m in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(dense_weight(m).shape[0]) for b, m in zip(biases, linears)])
