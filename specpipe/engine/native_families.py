"""The decoder families the native forward runs, as data: what differs between them, in one place.

A `Family` says how one transformers architecture lays out a decoder layer: which projections
its checkpoint holds (and so how q/k/v and gate/up are read into one fused projection each),
where its RMS norms sit (before and after attention and the MLP), whether q and k are normed
per head or over all heads, whether a norm scales by (1 + w), where its sliding windows and
rotary tables come from. A `Spec` is a family applied to one model's config: per layer its
window and rotary table, its activation, and the constant factors it multiplies by (embeddings,
residual branches, the attention scale, the logits), most of which are folded into the weights
once when they are read (`read_layer`). `spec_of` builds one from a config alone, or says why
the native forward cannot run it (what `specpipe check` reports before any weights load).

This module holds no forward (native_model.py runs the spec) and loads no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specpipe.models.quantize import dense_bias, dense_weight

STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope tables that do not depend on the sequence length
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")  # the MLP's gate activations the forward computes

PRE = ("input_layernorm", None, "post_attention_layernorm", None)  # Llama's norms: before attention, before the MLP


@dataclass(frozen=True)
class Family:
    """One architecture's layer layout (module names as transformers names them). A layer whose
    MLP holds `experts` is read as a sparse block (router and experts) whatever the family."""

    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # attention input projections, fused in this order
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")  # the MLP's gate and up projections, fused so
    # the norms around attention and the MLP: (attention pre, attention post, MLP pre, MLP post)
    norms: tuple[str | None, ...] = PRE
    qk_norm: str | None = None  # "head": q_norm/k_norm over each head's D values; "all": over all heads at once
    norm_offset: float = 0.0  # 1.0: every RMS norm scales by (1 + w) (Gemma)
    windows: str | None = None  # sliding windows from "layer_types" (per layer), "every" layer, or None
    rope_by_layer_type: bool = False  # one rotary table per layer type (Gemma 3's local and global bases)
    embed_scale: str | None = None  # "sqrt_hidden" (Gemma) or a config key that multiplies the embeddings
    residual_scale: str | None = None  # config key that multiplies each residual branch (Granite)
    attention_scale: str | None = None  # "query_pre_attn_scalar" (Gemma) or a config key that is the scale
    logit_divisor: str | None = None  # config key that divides the logits (Granite)
    softcap: str | None = None  # config key: logits = cap · tanh(logits / cap) (Gemma)


GEMMA3 = Family(norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                       "post_feedforward_layernorm"), qk_norm="head", norm_offset=1.0, windows="layer_types",
                rope_by_layer_type=True, embed_scale="sqrt_hidden", attention_scale="query_pre_attn_scalar",
                softcap="final_logit_softcapping")

FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(windows="layer_types"),
    "Qwen3ForCausalLM": Family(qk_norm="head", windows="layer_types"),
    "MistralForCausalLM": Family(windows="every"),
    "Gemma3ForCausalLM": GEMMA3,
    "Phi3ForCausalLM": Family(qkv=("qkv_proj",), gate_up=("gate_up_proj",), windows="every"),
    "GraniteForCausalLM": Family(embed_scale="embedding_multiplier", residual_scale="residual_multiplier",
                                 attention_scale="attention_multiplier", logit_divisor="logits_scaling"),
    "Olmo2ForCausalLM": Family(norms=(None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
                               qk_norm="all"),
    # its sparse layers' MLP is a router and experts (native_experts.py); mlp_only_layers keep a dense MLP
    "Qwen3MoeForCausalLM": Family(qk_norm="head", windows="every"),
}


@dataclass(frozen=True)
class Spec:
    """A family applied to one model's config."""

    family: Family
    windows: tuple[int | None, ...]  # per layer: keys within this many positions (None: all before)
    ropes: tuple[str | None, ...]  # per layer: its rotary table's layer type (None: the model's one table)
    activation: str = "silu"
    embed_scale: float = 1.0  # folded into the embedding table
    residual_scale: float = 1.0  # folded into each branch's last weight (its post-norm, else its projection)
    query_scale: float = 1.0  # the attention scale over 1/sqrt(D): folded into q (its norm, else its rows)
    logit_scale: float = 1.0  # folded into the LM head
    softcap: float | None = None  # applied to the logits
    kinds: tuple[str | None, ...] = field(init=False)  # the rotary tables, in the order they are laid side by side

    def __post_init__(self):
        object.__setattr__(self, "kinds", tuple(dict.fromkeys(self.ropes)))

    @property
    def llama_layout(self) -> bool:
        """Whether every layer is Llama's (pre-norms, SiLU, one rotary table over all of D, no q/k
        norm, no window, no softcap): what specpipe's fused C kernel stack implements. Factors folded
        into the weights change nothing there."""
        family = self.family
        return (family.norms == PRE and family.qk_norm is None and family.norm_offset == 0.0
                and self.activation == "silu" and self.kinds == (None,) and set(self.windows) == {None}
                and self.softcap is None)


def architecture_of(config, architecture: str | None = None) -> str:
    """The causal-LM class a config names, or transformers' own class for its model_type (a config
    read from a GGUF file before its first load has written the dense copy names none)."""
    if architecture:
        return architecture
    named = getattr(config, "architectures", None)
    if named:
        return named[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None), "unknown")


def spec_of(config, architecture: str | None = None) -> Spec | str:
    """The spec of a model from its config, or the reason the native forward cannot run it."""
    name = architecture_of(config, architecture)
    family = FAMILIES.get(name)
    if family is None:
        return f"{name} is not a native architecture (native: {', '.join(FAMILIES)})"
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    activation = "silu" if activation == "swish" else activation
    if activation not in ACTIVATIONS:
        return f"activation {activation} (native: {', '.join(ACTIVATIONS)})"
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    for kind, rope in _ropes(config, family, types).items():
        if rope not in STATIC_ROPE:
            where = f" ({kind} layers)" if kind else ""
            return f"rope scaling {rope!r}{where} depends on the sequence length (native: {', '.join(STATIC_ROPE)})"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit softcapping (the native forward attends with SDPA, which has no softcap)"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention (the native forward is causal)"
    window = getattr(config, "sliding_window", None)
    if family.windows == "layer_types":
        windows = tuple(window if kind == "sliding_attention" else None for kind in types)
    else:
        windows = (window if family.windows == "every" else None,) * layers
    default = 1 / math.sqrt(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return Spec(family, windows, tuple(types) if family.rope_by_layer_type else (None,) * layers, activation,
                embed_scale=_factor(config, family.embed_scale),
                residual_scale=_factor(config, family.residual_scale),
                query_scale=_scale(config, family.attention_scale) / default if family.attention_scale else 1.0,
                logit_scale=1 / _factor(config, family.logit_divisor),
                softcap=getattr(config, family.softcap, None) if family.softcap else None)


def _ropes(config, family: Family, types: list[str]) -> dict[str | None, str]:
    """Each rotary table's rope type, by layer type (None: the one table)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if family.rope_by_layer_type:
        return {kind: _rope_type(params.get(kind)) for kind in dict.fromkeys(types)}
    return {None: _rope_type(params)}


def _rope_type(params) -> str:
    return params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"


def _factor(config, key: str | None) -> float:
    if key is None:
        return 1.0
    if key == "sqrt_hidden":
        return config.hidden_size ** 0.5
    return float(getattr(config, key))


def _scale(config, key: str) -> float:
    """The attention's scale (what multiplies q·k)."""
    if key == "query_pre_attn_scalar":
        return config.query_pre_attn_scalar ** -0.5
    return float(getattr(config, key))


@dataclass
class LayerWeights:
    """One decoder layer's weights as the forward takes them, dense, factors folded in."""

    qkv: torch.Tensor  # [(heads + 2 kv heads) · D, H]: q, k, v rows
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, heads · D]
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor | None  # [2 · I, H]: gate rows, then up rows (None: experts instead)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor | None  # [H, I]
    down_bias: torch.Tensor | None
    norms: tuple[torch.Tensor | None, ...]  # (attention pre, attention post, MLP pre, MLP post), [H] each
    qk_norm: torch.Tensor | None  # "head": [heads + kv heads, D]; "all": [(heads + kv heads) · D]
    experts: MoE | None = None  # a sparse MLP block's router and experts


@dataclass
class MoE:
    """A sparse MLP block's weights (Qwen3-MoE)."""

    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2 · I, H]: per expert, gate rows then up rows
    down: torch.Tensor  # [E, H, I]
    top_k: int
    normalize: bool  # renormalize the top k probabilities to sum to 1


def read_layer(layer: torch.nn.Module, spec: Spec, heads: int, kv_heads: int, head_dim: int) -> LayerWeights:
    """A transformers decoder layer's weights, re-laid for the native forward (new tensors: the
    model's own are never changed)."""
    family, attn, mlp = spec.family, layer.self_attn, layer.mlp
    qkv, qkv_bias = _fused([getattr(attn, name) for name in family.qkv])
    o, o_bias = _dense(attn.o_proj)
    experts = _experts(mlp)
    if experts is None:
        gate_up, gate_up_bias = _fused([getattr(mlp, name) for name in family.gate_up])
        down, down_bias = _dense(mlp.down_proj)
    else:
        gate_up = gate_up_bias = down = down_bias = None
    norms = [None if name is None else norm_weight(getattr(layer, name), spec) for name in family.norms]
    qk = _qk_norm(attn, spec, heads, kv_heads, head_dim)
    q_rows = heads * head_dim
    if spec.query_scale != 1.0:  # q · k scaled: q's norm where it has one (the norm is last before rotary)
        if qk is None:
            qkv, qkv_bias = _scale_rows(qkv, q_rows, spec.query_scale), _scale_rows(qkv_bias, q_rows, spec.query_scale)
        else:
            qk = _scale_rows(qk, heads if family.qk_norm == "head" else q_rows, spec.query_scale)
    if spec.residual_scale != 1.0:  # each branch's last linear step: its post-norm, else its projection
        r = spec.residual_scale
        if norms[1] is not None:
            norms[1] = norms[1] * r
        else:
            o, o_bias = o * r, None if o_bias is None else o_bias * r
        if norms[3] is not None:
            norms[3] = norms[3] * r
        else:
            down, down_bias = down * r, None if down_bias is None else down_bias * r
    return LayerWeights(qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down, down_bias, tuple(norms), qk, experts)


def _experts(mlp: torch.nn.Module) -> MoE | None:
    """A sparse MLP block's weights (a router `gate` and stacked `experts`), or None for a dense MLP."""
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return None
    wide = lambda t: t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32)  # noqa: E731
    return MoE(wide(mlp.gate.weight), wide(experts.gate_up_proj), wide(experts.down_proj), mlp.gate.top_k,
               bool(mlp.gate.norm_topk_prob))


def norm_weight(norm: torch.nn.Module, spec: Spec) -> torch.Tensor:
    """An RMS norm's weight as `F.rms_norm` multiplies by: (1 + w) where the family's norms say so."""
    weight = norm.weight.detach()
    return weight + spec.family.norm_offset if spec.family.norm_offset else weight


def _qk_norm(attn: torch.nn.Module, spec: Spec, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor | None:
    """q's and k's norm weights side by side, as the forward applies them to q and k in one call."""
    kind = spec.family.qk_norm
    if kind is None:
        return None
    q, k = norm_weight(attn.q_norm, spec), norm_weight(attn.k_norm, spec)
    if kind == "head":  # [D] each, one per head: [heads + kv heads, D]
        return torch.cat([q.expand(heads, head_dim), k.expand(kv_heads, head_dim)])
    return torch.cat([q, k])  # [(heads + kv heads) · D]


def _fused(linears: list[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linears stacked by rows (one already fused in the checkpoint is itself)."""
    dense = [_dense(m) for m in linears]
    weight = torch.cat([w for w, _ in dense]) if len(dense) > 1 else dense[0][0]
    if all(b is None for _, b in dense):
        return weight, None
    return weight, torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype) for w, b in dense])


def _dense(linear: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias in a wide float (float64 tiny models stay float64, others float32)."""
    weight = getattr(linear, "weight", None)
    dtype = torch.float64 if isinstance(weight, torch.Tensor) and weight.dtype == torch.float64 else torch.float32
    bias = dense_bias(linear)
    return dense_weight(linear, dtype), None if bias is None else bias.to(dtype)


def _scale_rows(t: torch.Tensor | None, rows: int, factor: float) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.clone()
    t[:rows] *= factor
    return t
