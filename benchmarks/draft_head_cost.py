"""Cost of one EAGLE draft token per head precision (`proposer.quantize`).

Usage: python benchmarks/draft_head_cost.py [HEADS] [--model=smollm2-135m] [--context=200]
(HEADS: a heads folder, default recipes/smollm2-135m/eagle). One draft token is what the chain
proposer does per token: the draft LM head's logits, the argmax, then one head forward that
feeds the guess back over a cache of `context` rows. Prints the median ms per draft token for
none / fp16 / int8 (each measured twice, interleaved, to show the machine's noise).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specpipe.heads.eagle import HeadCache
from specpipe.heads.io import load_eagle
from specpipe.models.loader import load_model, resolve
from specpipe.models.quantize import quantize_model
from specpipe.proposers.eagle import DraftLM


def per_token_ms(heads: str, target: torch.nn.Module, mode: str, context: int, reps: int = 300) -> float:
    head = quantize_model(load_eagle(heads).float(), mode)
    lm, embed, size = DraftLM(target, head.draft_vocab, mode), target.get_input_embeddings(), head.shape.hidden_size
    cache = HeadCache()
    times = []
    with torch.inference_mode():
        head(torch.randn(1, context, size), torch.randn(1, context, size), torch.arange(context)[None], None, cache)
        hidden = torch.randn(size)
        for i in range(reps + 20):  # the first 20 warm up
            start = time.perf_counter()
            token = int(lm.top(hidden, 1)[1][0])  # as the chain drafts greedily
            hidden = head(embed(torch.tensor([token]))[None], hidden[None, None], torch.tensor([[context]]),
                          None, cache)[0, -1]
            cache.crop(context)  # every token drafted at the same depth
            if i >= 20:
                times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv: list[str]) -> None:
    options = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
    heads = next((a for a in argv if not a.startswith("--")), "recipes/smollm2-135m/eagle")
    target = quantize_model(load_model(resolve(options.get("model", "smollm2-135m"))), "fp16")
    context = int(options.get("context", 200))
    for mode in ("none", "fp16", "int8") * 2:
        print(f"{mode:5s} {per_token_ms(heads, target, mode, context):.2f} ms per draft token", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
