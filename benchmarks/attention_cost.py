"""What the static step's attention costs a layer, by width and by layout: the question a GPU
run settles for the next change to attention.

    python benchmarks/attention_cost.py [--device cuda] [--models smollm2-135m qwen2.5-coder-1.5b]

For each model's attention shape (its query and kv heads, head size; random values, bf16 on a
GPU, the CPU's bf16 too), one sequence (batch 1) at a block of K = 1 and 5 tokens and widths of
256, 512, 1,024 and 2,112 slots (`cache_len=2048`'s whole allocation), it times two layouts of
the same attention, each with what it needs around SDPA:
- `grouped`, the stack's today (`NativeLM.stack`): each kv head's query heads folded into its
  rows, [1, kv heads, group · K, D] (a regrouping copy where K > 1), SDPA over the cache's keys
  and values with an additive mask [1, 1, group · K, width], the output regrouped back (a copy);
- `tokens`: each token its own batch entry, [K, kv heads, group, D] (a view, no copy), the keys
  and values broadcast over the K entries (stride 0, no copy), a mask [K, 1, 1, width], the
  output a view. Whether SDPA's fused GPU kernel takes stride-0 keys without a copy or a math
  fallback is what only a GPU can say: the backend SDPA picks for each layout is printed.
On a GPU the 30 calls of a step (one a layer) are captured as one CUDA graph and replayed,
timed with CUDA events, so a row is what a graphed step pays a layer; on the CPU they run
eagerly, timed by the wall clock. Prints a markdown table: µs a layer for each layout, and the
backends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# (query heads, kv heads, head size) of the targets' attention
SHAPES = {"smollm2-135m": (9, 3, 64), "qwen2.5-coder-0.5b": (14, 2, 64), "qwen2.5-coder-1.5b": (12, 2, 128)}
LAYERS = 30  # calls a timed step makes (one a layer)
BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def layouts(heads: int, kv: int, dim: int, block: int, width: int, device: str, dtype: torch.dtype) -> dict:
    """The two layouts' calls for one shape -> {name: (a call -> [K, heads · D], SDPA's arguments)}."""
    group = heads // kv
    cache = torch.randn(1, 2 * kv, width, dim, device=device, dtype=dtype)  # keys, then values
    keys, values = cache[:, :kv], cache[:, kv:]
    qkv = torch.randn(block, heads + 2 * kv, dim, device=device, dtype=dtype)  # the fused projection's output
    positions = width - block + torch.arange(block, device=device)  # the block at the width's end
    visible = torch.arange(width, device=device)[None] <= positions[:, None]  # [K, width]
    grouped_mask = visible[:, None].expand(block, group, width).transpose(0, 1).reshape(1, 1, group * block, width)
    grouped_bias = torch.zeros(grouped_mask.shape, device=device, dtype=dtype).masked_fill_(~grouped_mask, -torch.inf)
    token_bias = torch.zeros(block, 1, 1, width, device=device, dtype=dtype).masked_fill_(
        ~visible[:, None, None], -torch.inf)

    def grouped_args():
        q = qkv[:, :heads].reshape(1, block, kv, group, dim).permute(0, 2, 3, 1, 4).reshape(1, kv, group * block, dim)
        return q, keys, values, grouped_bias

    def grouped():
        att = F.scaled_dot_product_attention(*grouped_args()[:3], attn_mask=grouped_bias)
        return att.view(1, kv, group, block, dim).permute(0, 3, 1, 2, 4).reshape(block, heads * dim)

    def token_args():
        return (qkv[:, :heads].view(block, kv, group, dim), keys.expand(block, -1, -1, -1),
                values.expand(block, -1, -1, -1), token_bias)

    def tokens():
        q, k, v, bias = token_args()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).view(block, heads * dim)

    return {"grouped": (grouped, grouped_args), "tokens": (tokens, token_args)}


def backend(args) -> str:
    try:
        return BACKENDS.get(int(torch._fused_sdp_choice(*args)), "?")
    except Exception as error:  # noqa: BLE001 (a private call: its absence is reported, not fatal)
        return f"? ({type(error).__name__})"


def timed(call, device: str, repeats: int) -> float:
    """µs a call, LAYERS calls a step: a replayed CUDA graph on a GPU, eager on the CPU."""
    step = lambda: [call() for _ in range(LAYERS)]  # noqa: E731
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up, as torch documents for capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        begin.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e3 / (repeats * LAYERS)
    step()
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(max(repeats // 5, 1)):
            step()
        rounds.append((time.perf_counter() - started) / (max(repeats // 5, 1) * LAYERS) * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-1.5b"], choices=sorted(SHAPES))
    parser.add_argument("--widths", nargs="+", type=int, default=[256, 512, 1024, 2112])
    parser.add_argument("--blocks", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16
    print(f"Attention a layer, batch 1, {args.device}, bf16: µs a call, {LAYERS} calls a step "
          f"({'one replayed CUDA graph' if args.device == 'cuda' else 'eager'}); SDPA's backend for each layout")
    print()
    print("| model | K | width | grouped µs | tokens µs | tokens / grouped | backends (grouped, tokens) |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        heads, kv, dim = SHAPES[model]
        for block in args.blocks:
            for width in args.widths:
                calls = layouts(heads, kv, dim, block, width, args.device, dtype)
                cost = {name: attempt(call, calls["grouped"][0], args, f"{model} K={block} width={width} {name}")
                        for name, (call, _) in calls.items()}
                ratio = (f"{cost['tokens'] / cost['grouped']:.2f}"
                         if all(isinstance(c, float) for c in cost.values()) else "-")
                cells = [f"{c:.2f}" if isinstance(c, float) else c for c in cost.values()]
                print(f"| {model} | {block} | {width} | {cells[0]} | {cells[1]} | {ratio} | "
                      f"{backend(calls['grouped'][1]())}, {backend(calls['tokens'][1]())} |", flush=True)


def attempt(call, reference, args, what: str) -> float | str:
    """µs a call, checked against the stack's layout first; a layout a device refuses is a
    table cell ("failed: ..."; the error in full on stderr), not the end of the table."""
    try:
        torch.testing.assert_close(call(), reference(), rtol=2e-2, atol=2e-2)  # the same attention
        return timed(call, args.device, args.repeats)
    except Exception as error:  # noqa: BLE001 (what the device refused is the result)
        print(f"{what}: {error!r}", file=sys.stderr)
        return f"failed: {type(error).__name__}"


if __name__ == "__main__":
    main()
