"""What a model will take in memory, from its config alone (`specpipe check` loads no weights):
weight bytes at a precision and KV cache bytes for a cache length. `bench` reports what the
runners really hold (`Runner.memory()`); the two agree to a few percent (tests/test_engine.py)."""

from __future__ import annotations

from specpipe.models.quantize import BF16

# bytes per weight by precision (int8: one byte plus a per-channel scale, negligible)
WEIGHT_BYTES = {"none": 4, "fp16": 2, "int8": 1, "bf16": 2, "w8a16": 1, "w8a32": 1, "w8a8": 1, "w4a8": 0.5625}


def parameters(config) -> tuple[int, int]:
    """(Linear weights in the decoder layers and LM head, embedding entries) of a decoder-only LM."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = sum(_mlp(config, layer) for layer in range(layers))
    embedding = config.vocab_size * hidden
    return layers * attention + mlp + embedding, embedding  # the LM head is a Linear of the embedding's size


def _mlp(config, layer: int) -> int:
    """One layer's MLP weights: gate, up, down; a sparse block's are its experts' and its router's
    (Qwen3-MoE's rule for which layers are sparse)."""
    experts = getattr(config, "num_experts", 0) or 0
    sparse = experts > 0 and layer not in (getattr(config, "mlp_only_layers", None) or []) \
        and (layer + 1) % (getattr(config, "decoder_sparse_step", 1) or 1) == 0
    if sparse:
        return experts * (3 * config.hidden_size * config.moe_intermediate_size + config.hidden_size)
    return 3 * config.hidden_size * config.intermediate_size


def weight_bytes(config, precision: str) -> int:
    linears, embedding = parameters(config)
    table = 4 if precision == "none" else 2  # the native engine keeps the embedding in fp32, fp16 or bf16
    return linears * WEIGHT_BYTES.get(precision, 4) + embedding * table


def cache_bytes(config, precision: str, tokens: int) -> int:
    """Keys and values of `tokens` positions (bf16 in the exact precisions, fp32 otherwise)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = 2 if precision in BF16 else 4
    return 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * element


def mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"
