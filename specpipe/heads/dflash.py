"""A DFlash drafter (Chen, Liang, Liu 2026): a few non-causal Qwen3 decoder layers that draft a
whole block of tokens in one forward, reading the target's hidden states as context.

Context: at every committed position i, the target's residual streams after the layers
`target_layer_ids` are concatenated, fused to the hidden size by `fc` and `hidden_norm`, and
every draft layer projects that one row to keys (`k_norm`, then RoPE at i) and values. The
block: the last committed token at its position c, then mask tokens at c+1..c+γ, embedded by
the target's own embeddings (times `embedding_scale`). The block's rows attend to every
context row and to each other, with no causal mask: one forward guesses all γ tokens. Its
outputs at the mask positions, normed by `norm`, are scored by the target's LM head (or the
checkpoint's own over a draft vocabulary, `d2t`); draft token i is the best at position c+i.

Context rows never pass through the layers (only their keys and values are read), so each
layer's keys and values of a committed position are computed once and kept (`context`): what
z-lab's DynamicCache keeps between steps and what vLLM's `precompute_and_store_context_kv`
writes into its cache.

Weights as z-lab's `DFlashDraftModel` and speculators' `DFlashDraftModel` name them:
`fc.weight` [H, k·H] (k target layers), `hidden_norm.weight`, `layers.{i}.input_layernorm`,
`layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.self_attn.{q_norm,k_norm}.weight`
[head dim], `layers.{i}.post_attention_layernorm`, `layers.{i}.mlp.{gate,up,down}_proj.weight`,
`norm.weight`; a speculators drafter with a draft vocabulary adds `lm_head.weight` [K, H] and
`d2t` [K]. Reading the checkpoint formats is specpipe/heads/dflash_format.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from specpipe.heads.eagle import MLP, Attention, EagleShape, RMSNorm, _rotate, project_add, stacked


@dataclass(frozen=True)
class DFlashShape:
    layer: EagleShape  # every draft layer's shape (vocab_size: the target's)
    num_layers: int
    target_layer_ids: tuple[int, ...]  # the runner's keys: the residual stream after these target layers
    block_size: int  # the block it was trained on: the last token and block_size - 1 masks
    mask_token_id: int  # a row of the target's embeddings
    embedding_scale: float = 1.0  # z-lab's `input_embedding_scale`
    logit_scale: float = 1.0  # z-lab's `output_multiplier`
    logit_softcap: float | None = None  # z-lab's `final_logit_softcapping`
    draft_vocab_size: int | None = None  # its own LM head over this many tokens (None: the target's)

    @property
    def gamma_max(self) -> int:
        """Draft tokens a forward makes at most: the masks it was trained to fill."""
        return self.block_size - 1


class DFlashAttention(Attention):
    """EAGLE's attention (specpipe/heads/eagle.py: stacked projections, rotary tables, grouped
    heads) with Qwen3's per-head `q_norm` and `k_norm`, keys and values over context and block."""

    def __init__(self, shape: EagleShape):
        super().__init__(shape)
        self.q_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)
        self.k_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)

    def context(self, fused: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fused context rows [N, H] at positions [N] -> keys, values [N, kv heads, d]."""
        n, d = fused.shape[0], self.head_dim
        weight = stacked(self, ("k_proj", "v_proj"))
        k, v = (self.k_proj(fused), self.v_proj(fused)) if weight is None else F.linear(fused, weight).chunk(2, -1)
        k = self.k_norm(k.view(1, n, self.kv_heads, d)).transpose(1, 2)  # [1, kv heads, N, d]
        cos, sin = self._tables(positions[None])
        return _rotate(k, cos, sin)[0].transpose(0, 1), v.view(n, self.kv_heads, d)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor,
                mask: torch.Tensor | None, residual: torch.Tensor) -> torch.Tensor:
        """x [B, W, H] block rows at positions [B, W]; past_keys, past_values [B, kv heads, S, d]
        each row's context; mask [B, W, S + W] bool (None: every key seen) -> residual + attention
        [B, W, H]."""
        b, w, _ = x.shape
        q, k, v = self._project(x)
        q = self.q_norm(q.view(b, w, self.heads, self.head_dim)).transpose(1, 2)  # [B, heads, W, d]
        k = self.k_norm(k.view(b, w, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = v.view(b, w, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self._tables(positions)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys = torch.cat([past_keys.to(k.dtype), k], 2)  # [B, kv heads, S + W, d]: no causal order anywhere
        values = torch.cat([past_values.to(v.dtype), v], 2)
        out = self._grouped(q, keys, values, mask)
        return project_add(self.o_proj, out.transpose(1, 2).reshape(b, w, -1), residual)


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose attention also reads the context's keys and values."""

    def __init__(self, shape: EagleShape):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = DFlashAttention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x, positions, past_keys, past_values, mask):
        x = self.self_attn(self.input_layernorm(x), positions, past_keys, past_values, mask, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class DFlashDrafter(nn.Module):
    def __init__(self, shape: DFlashShape):
        super().__init__()
        self.shape = shape
        h = shape.layer.hidden_size
        self.fc = nn.Linear(len(shape.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, shape.layer.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(shape.layer) for _ in range(shape.num_layers)])
        self.norm = RMSNorm(h, shape.layer.rms_norm_eps)
        self.lm_head = None if shape.draft_vocab_size is None else nn.Linear(h, shape.draft_vocab_size, bias=False)
        if shape.draft_vocab_size is not None:
            self.register_buffer("d2t", torch.zeros(shape.draft_vocab_size, dtype=torch.long))

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """[K] the target token id of each draft id (None: it scores the whole vocabulary)."""
        return None if self.lm_head is None else torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's features of committed positions [N, k·H] (layer order) at positions [N]
        -> every draft layer's keys and values of them, [N, layers, kv heads, d] each."""
        fused = self.hidden_norm(self.fc(features.to(self._dtype)))  # [N, H]
        pairs = [layer.self_attn.context(fused, positions) for layer in self.layers]
        return torch.stack([k for k, _ in pairs], 1), torch.stack([v for _, v in pairs], 1)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [B, W, H] of the block (the last token, then masks) at positions [B, W];
        past_keys, past_values [layers, B, kv heads, S, d] each row's context (`context`);
        mask [B, W, S + W] bool (None: every key seen) -> normed outputs [B, W, H]."""
        x = embeds.to(self._dtype) * self.shape.embedding_scale
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, past_keys[i], past_values[i], mask)
        return self.norm(x)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """An LM head's logits -> the drafter's float32 scores (z-lab's `compute_logits`)."""
        logits = logits.float() * self.shape.logit_scale
        cap = self.shape.logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    @property
    def _dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # a norm: never swapped for a packed kernel


class ContextCache:
    """Every draft layer's keys and values of every row's context: [layers, rows, kv heads,
    capacity, d] each (allocated at the first write, in its dtype), row r's context in its
    first slots. Slots grow by doubling; writes and reads take host ints, never a read back."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.rows = 1

    def reserve(self, rows: int) -> None:
        if rows > self.rows:
            self.rows = rows
            if self.keys is not None:
                self._resize(rows, self.keys.shape[3])

    def write(self, index: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: int) -> None:
        """keys, values [N, layers, kv heads, d] at (row, slot) pairs index [2, N] (on the device);
        end: the highest slot written + 1 (host)."""
        if self.keys is None:
            n, layers, heads, d = keys.shape
            self.keys = keys.new_zeros(layers, self.rows, heads, max(end, 64), d)
            self.values = torch.zeros_like(self.keys)
        elif end > self.keys.shape[3]:
            self._resize(self.keys.shape[1], max(end, 2 * self.keys.shape[3]))
        row, slot = index[0], index[1]
        self.keys[:, row, :, slot] = keys  # advanced indices apart: the indexed view is [N, layers, kv heads, d]
        self.values[:, row, :, slot] = values

    def view(self, rows: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `width` slots of `rows`: [layers, B, kv heads, width, d] each (a view where
        the rows are 0..B-1, as in a batch where every row drafts)."""
        if self.keys is None:  # no context anywhere yet (one-token prompts)
            return torch.empty(0), torch.empty(0)
        if rows == list(range(len(rows))):
            return self.keys[:, : len(rows), :, :width], self.values[:, : len(rows), :, :width]
        index = torch.tensor(rows).to(self.keys.device, non_blocking=True)
        return self.keys[:, index, :, :width], self.values[:, index, :, :width]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)

    def _resize(self, rows: int, capacity: int) -> None:
        old_keys, old_values = self.keys, self.values
        layers, had, heads, width, d = old_keys.shape
        self.keys = old_keys.new_zeros(layers, rows, heads, capacity, d)
        self.values = torch.zeros_like(self.keys)
        self.keys[:, :had, :, :width], self.values[:, :had, :, :width] = old_keys, old_values


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default taps for a checkpoint that names none: spread from layer 1 to L - 3, one
    per draft layer (the middle layer for a single one)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))
