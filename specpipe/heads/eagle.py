"""An EAGLE draft head (Li et al. 2024): one decoder layer that predicts the target's next feature.

Input row i is the pair (target feature f_i, embedding of token i+1): `fc` maps their
concatenation [embedding, feature] to the hidden size, one Llama decoder layer (causal
attention over the earlier rows, through the head's own KV cache) turns it into a guess of
f_{i+1}, and the target's own LM head turns that guess into a guess of token i+2. Drafting
feeds each guess back as the next row's feature. Row i sits at position i, the position of
its feature's token, as in vLLM.

Layout as vLLM's `EagleLlamaForCausalLM` reads it: `fc.weight` [H, 2H] without bias,
`layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.post_attention_layernorm.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`; layer 0 has no input norm and the head no final
norm (EAGLE's features are the target's normed last hidden states already). Token embeddings
and the LM head are the target's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class EagleShape:
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @classmethod
    def of_target(cls, config, intermediate_size: int | None = None) -> "EagleShape":
        """The shape of one of the target's own layers (a smaller MLP if asked)."""
        heads = config.num_attention_heads
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", None)
        return cls(config.hidden_size, config.vocab_size, heads, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads,
                   intermediate_size or config.intermediate_size, float(rope or 10000.0), float(config.rms_norm_eps))

    def as_dict(self) -> dict:
        return asdict(self)


class HeadCache:
    """Keys and values of the rows fed so far, appended by concatenation: [B, kv heads, length,
    head dim] each. Training's unrolled steps keep a batch's earlier steps here, with gradients
    through them (a preallocated buffer written in place would break autograd's saved views);
    decoding uses `SlotCache`. The tests use it as the plain reference of the head's pass."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], 2), torch.cat([self.values, values], 2)
        self.keys, self.values = keys, values
        return keys, values

    def crop(self, length: int) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)


class SlotCache:
    """Decoding's head cache: every row of a batch over preallocated slots, [rows, kv heads,
    capacity, head dim] keys and values (allocated at the first write, in its keys' dtype). Row
    i of a sequence sits at slot i; a forward writes its rows at the slots it is given (`at`,
    device tensors) and attends over the first `width` slots through its mask, so rows of
    different lengths share one forward, and a graph can write where the device says. The
    cache keeps no lengths: its owner knows each row's committed rows, and what lies past them
    is scratch (drafted rows, padding), overwritten by the next forward. `ensure` grows it from
    the host (new buffers: `grown` counts it, and graphs that wrote into the old ones are stale)."""

    def __init__(self, capacity: int = 0, rows: int = 1):
        self.capacity, self.rows = capacity, rows
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.grown = 0

    def ensure(self, rows: int, end: int) -> None:
        """Room for cache rows [0, rows) and slots [0, end): grown (the slots doubled) where short."""
        if rows <= self.rows and end <= self.capacity:
            return
        self.rows = max(rows, self.rows)
        if end > self.capacity:
            self.capacity = max(end, 2 * self.capacity)
        if self.keys is not None:
            kept = self.keys, self.values
            self.keys = self.values = None
            self._allocate(*kept)
            b, _, length, _ = kept[0].shape
            self.keys[:b, :, :length], self.values[:b, :, :length] = kept
            self.grown += 1

    def at(self, rows: torch.Tensor, first: bool, slots: torch.Tensor, width: int) -> "_Slots":
        """This cache as one forward sees it: its rows `rows` [A] (`first`: they are rows 0..A-1,
        read as views, no gather) write their keys at `slots` [A, n] and attend over the first
        `width` slots of each row (the forward's mask [A, n, width] says which)."""
        return _Slots(self, rows, first, slots, width)

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.keys is None:
            _, heads, _, dim = keys.shape
            self.keys = keys.new_zeros(self.rows, heads, self.capacity, dim)
            self.values = values.new_zeros(self.rows, heads, self.capacity, values.shape[-1])


class _Slots:
    def __init__(self, cache: SlotCache, rows: torch.Tensor, first: bool, slots: torch.Tensor, width: int):
        self.cache, self.rows, self.first, self.slots, self.width = cache, rows, first, slots, width

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values [A, kv heads, n, d] written at the rows' slots -> [A, kv heads, width, d]."""
        cache = self.cache
        cache._allocate(keys, values)  # the first rows may come through a graph (its warm-up allocates)
        at = (self.rows[:, None], slice(None), self.slots)  # [A, n] slots of [A] rows: [A, n, kv heads, d]
        cache.keys[at], cache.values[at] = keys.transpose(1, 2), values.transpose(1, 2)
        if self.first:
            count = len(self.rows)
            return cache.keys[:count, :, : self.width], cache.values[:count, :, : self.width]
        return cache.keys[self.rows, :, : self.width], cache.values[self.rows, :, : self.width]


class Attention(nn.Module):
    def __init__(self, shape: EagleShape, width: int | None = None):
        """width: the rows' size (default the hidden size; EAGLE-3 attends over [embedding, feature], 2H)."""
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        width = width or h
        self.heads, self.kv_heads, self.head_dim = shape.num_attention_heads, shape.num_key_value_heads, d
        self.q_proj = nn.Linear(width, self.heads * d, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        inv_freq = 1.0 / shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        # [d]: each rotary angle's frequency, the first half negated: its sine is rotate-half's
        # signed sine, its cosine the cosine (an even function), so no negation runs per token
        self.register_buffer("freqs", torch.cat([-inv_freq, inv_freq]), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                cache: HeadCache | None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, n, width]; positions [B, n]; mask [B, n, past + n] bool (None: causal); -> [B, n, H],
        added to `residual` [B, n, H] where one is given."""
        b, n, _ = x.shape
        q, k, v = self._project(x)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # [B, heads, n, d]
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self._tables(positions)  # one pair of tables for q and k
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:  # the earlier rows (decoding) or unrolled steps (training)
            k, v = cache.append(k, v)
        if mask is None and k.shape[2] == n:  # training: causal over the rows, nothing cached
            # enable_gqa: each kv head serves its query heads without a copy of its keys per head
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if mask is None and n > 1:  # causal over the new rows, everything cached before them
                past = k.shape[2] - n
                mask = torch.ones(n, past + n, dtype=torch.bool, device=k.device).tril(past)[None]
            out = self._grouped(q, k, v, mask)  # (None: a chain's draft row sees every row cached)
        return project_add(self.o_proj, out.transpose(1, 2).reshape(b, n, -1), residual)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, n, heads · d or kv heads · d] of x: one matmul over the stacked weights in
        decoding (`stacked`), three Linears where gradients flow."""
        weight = None if torch.is_grad_enabled() else stacked(self, ("q_proj", "k_proj", "v_proj"))
        if weight is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        d = self.head_dim
        return F.linear(x, weight).split((self.heads * d, self.kv_heads * d, self.kv_heads * d), -1)

    def _grouped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention with each kv head's query heads folded into its rows, as the target's stack
        does: q [B, heads, n, d] -> [B, kv heads, group·n, d], mask [B, n, S] repeated per group
        -> [B, heads, n, d]. SDPA's fused GPU kernels take a mask or grouped heads, not both (and
        no grouped heads in fp32, the heads' GPU precision): `enable_gqa` would fall back to its
        math kernel, a copy of the whole cache per query head at every draft token."""
        b, _, n, d = q.shape
        group = self.heads // self.kv_heads
        folded = q.reshape(b, self.kv_heads, group * n, d)  # query head h = kv head h // group, as GQA pairs them
        grouped = None if mask is None else mask.repeat(1, group, 1)[:, None]  # [B, 1, group·n, S]
        return F.scaled_dot_product_attention(folded, k, v, attn_mask=grouped).view(b, self.heads, n, d)

    def _tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, n] -> cos, signed sin [B, 1, n, d] (float32; see `freqs`): four
        kernels, once for q and k (each draft token of a graphed chain runs them)."""
        angles = positions[..., None].float() * self.freqs  # [B, n, d]
        return angles.cos()[:, None], angles.sin()[:, None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary of x [B, heads, n, d] with cos and signed sin (`_tables`): three
    kernels (the half swap, a product, a multiply-add), where rotate-half's negation would be a
    fourth; a sign flip is exact."""
    x1, x2 = x.chunk(2, -1)
    return (x * cos.to(x.dtype)).addcmul_(torch.cat([x2, x1], -1), sin.to(x.dtype))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`F.rms_norm` (one fused kernel on a GPU, where the written-out form is six) where x
        and the weight share a dtype, as they do in decoding; the written-out form otherwise."""
        if x.dtype == self.weight.dtype:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, shape: EagleShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, n, H] -> [B, n, H], added to `residual` where one is given; the gate and up
        projections one matmul in decoding (`stacked`)."""
        weight = None if torch.is_grad_enabled() else stacked(self, ("gate_proj", "up_proj"))
        gate, up = (self.gate_proj(x), self.up_proj(x)) if weight is None else F.linear(x, weight).chunk(2, -1)
        return project_add(self.down_proj, F.silu(gate) * up, residual)


def stacked(module: nn.Module, names: tuple[str, ...]) -> torch.Tensor | None:
    """The weights of `module`'s Linears `names` stacked along their outputs [Σ out, in], so a
    decoding step computes them in one matmul (one kernel on a GPU, where each was one). Kept
    on the module while every weight is unchanged: the same storage at the same version (a
    training step, a load or a move makes a new one). None where one is not a plain Linear
    without bias (a packed CPU kernel computes its own). Decoding only: no gradient flows
    through it."""
    linears = [getattr(module, name) for name in names]
    if not all(type(m) is nn.Linear and m.bias is None for m in linears):
        return None
    key = tuple((m.weight.data_ptr(), _version(m.weight), m.weight.dtype) for m in linears)
    kept = module.__dict__.setdefault("_stacked", {})
    if names not in kept or kept[names][0] != key:
        kept[names] = key, torch.cat([m.weight for m in linears])
    return kept[names][1]


def _version(weight: torch.Tensor) -> int:
    """A weight's in-place changes so far; an inference tensor (made under `inference_mode`,
    where no training step runs) tracks none: -1."""
    return -1 if weight.is_inference() else weight._version


def project_add(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """residual + linear(x) (linear(x) where residual is None), x [B, n, in], residual
    [B, n, out]: in decoding one GEMM that adds (`addmm`, beta = 1), one kernel where the
    matmul and the add were two, where the Linear is a plain one without bias."""
    if residual is None:
        return linear(x)
    if torch.is_grad_enabled() or type(linear) is not nn.Linear or linear.bias is not None:
        return residual + linear(x)
    rows = x.reshape(-1, x.shape[-1])
    return torch.addmm(residual.reshape(-1, residual.shape[-1]), rows, linear.weight.t()).view(residual.shape)


class DecoderLayer(nn.Module):
    """A Llama decoder layer without its input norm (EAGLE's layer 0)."""

    def __init__(self, shape: EagleShape):
        super().__init__()
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x, positions, mask, cache):
        x = self.self_attn(x, positions, mask, cache, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class EagleHead(nn.Module):
    def __init__(self, shape: EagleShape):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(2 * shape.hidden_size, shape.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(shape)])
        self.draft_vocab: torch.Tensor | None = None  # [K] token ids it drafts from (None: all)

    def fuse(self, target_features: torch.Tensor) -> torch.Tensor:
        """The target's features as the head reads them: EAGLE's are the LM head's input, as they are."""
        return target_features

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None, cache: HeadCache | None = None) -> torch.Tensor:
        """embeds, features [B, n, H]; positions [B, n] -> guessed next features [B, n, H].

        cache: the rows are written into it (decoding: a `SlotCache`'s rows and slots) or
        appended (training's `HeadCache`), and attend to what it returns as `mask` [B, n, width]
        allows (None: everything before them, causally)."""
        dtype = self.layers[0].post_attention_layernorm.weight.dtype  # a norm: never swapped for a packed kernel
        x = self.fc(torch.cat([embeds, features], -1).to(dtype))
        return self.layers[0](x, positions, mask, cache)
