"""The model families' table of docs/engine.md: ms per k-token forward, native engine against
transformers' own forward (engine=hf: eager, on its DynamicCache), per tiny family.

    python benchmarks/families.py --precision none --reps 30

Each family is the tiny random model tests/test_families.py builds (2 or 3 layers, hidden 32,
vocabulary 64; its windows shorter than the context), in float32, so the figures are what a
forward costs besides its arithmetic: the host's work per layer (norms, rotary, masks, cache
writes, the row-by-row attention of the exact precisions) on one model of each layout. A k-token
block (k = 1, 2, 5, 9) is appended to a 24-token cache (past the windows), median of `--reps`
calls. One process, one thing at a time: never time with another heavy job running.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GraniteConfig, GraniteForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from specpipe.engine import make_runner

BLOCKS = (1, 2, 5, 9)
WINDOW = 5
SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=2, eos_token_id=1, pad_token_id=0)
FAMILIES = {  # as tests/test_families.py builds them
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(num_hidden_layers=2, **SIZES)),
    "qwen2-window": (Qwen2ForCausalLM, lambda: Qwen2Config(num_hidden_layers=2, use_sliding_window=True,
                                                           sliding_window=WINDOW, max_window_layers=1, **SIZES)),
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(num_hidden_layers=2, head_dim=16, **SIZES)),
    "mistral-window": (MistralForCausalLM, lambda: MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SIZES)),
    "gemma3": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(
        num_hidden_layers=3, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=12, final_logit_softcapping=6.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}}, **SIZES)),
    "phi3": (Phi3ForCausalLM, lambda: Phi3Config(
        num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5}, **SIZES)),
    "granite": (GraniteForCausalLM, lambda: GraniteConfig(
        num_hidden_layers=2, embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3,
        logits_scaling=0.5, **SIZES)),
    "olmo2": (Olmo2ForCausalLM, lambda: Olmo2Config(num_hidden_layers=2, **SIZES)),
    "qwen3-moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(
        num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        norm_topk_prob=True, mlp_only_layers=[1], **SIZES)),
}
CONTEXT = [5, 17, 33, 2, 9, 41, 12, 30, 7, 8, 22, 50] * 2  # 24 tokens: past the windows


def forward_ms(runner, k: int, reps: int) -> float:
    """Median ms of a k-token forward appended to CONTEXT (the cache prefilled anew before each call,
    untimed: transformers' sliding-window cache keeps no keys past its window to roll back to)."""
    block = torch.tensor([CONTEXT[-1:] + list(range(20, 19 + k))])
    times = []
    for _ in range(reps + 1):  # the first: warm-up
        runner.reset()
        runner.prefill(0, CONTEXT[:-1])
        started = time.perf_counter()
        runner.forward(block)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--precision", default="none", help="the native engine's precision (hf runs float32)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    print(f"| family | native {args.precision}: k=1 | k=2 | k=5 | k=9 | transformers: k=1 | k=2 | k=5 | k=9 "
          "| native / transformers at k=1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.families:
        cls, config = FAMILIES[name]
        torch.manual_seed(0)
        model = cls(config()).float().eval()
        native = make_runner(model, engine="native", precision=args.precision, cache_len=64)
        hf = make_runner(model, engine="hf")
        mine = [forward_ms(native, k, args.reps) for k in BLOCKS]
        theirs = [forward_ms(hf, k, args.reps) for k in BLOCKS]
        cells = [f"{ms:.2f}" for ms in mine + theirs]
        print(f"| {name} | " + " | ".join(cells) + f" | {mine[0] / theirs[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
