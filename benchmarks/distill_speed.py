"""Self-distillation speed, before and after batched native decoding (docs/training.md).

The same instructions (train/prompts.py) answered greedily by the same fp16 target: transformers'
batched `generate` (static batches of 32, sorted by length: the path before) and specpipe's
batched decoder (continuous batching, `distill_batch` rows: the native engine's path now), one
after the other in one process. Run alone on the machine:

    python benchmarks/distill_speed.py --model smollm2-135m --prompts 64 --tokens 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from specpipe.engine import make_runner
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.models.quantize import quantize_model
from specpipe.train import distill
from specpipe.train.prompts import instructions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    source = resolve(args.model)
    tokenizer, model = load_tokenizer(source), quantize_model(load_model(source), "fp16")
    prompts = instructions(args.prompts)
    runner = make_runner(model, engine="native", precision="fp16")
    runs = {"transformers generate, batches of 32": dict(batch=32)}
    for rows in args.batch:
        runs[f"specpipe batched, {rows} rows"] = dict(batch=max(2 * rows, 32),
                                                      decode=distill.batched_decoder(runner, model, tokenizer, rows))
    for name, options in runs.items():
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            answers = distill.answers(model, tokenizer, prompts, args.tokens, Path(tmp) / "a.jsonl", **options)
            wall = time.perf_counter() - started
        tokens = sum(len(ids) - start - 1 for ids, start in answers)
        print(f"{name}: {len(answers) / wall:.2f} answers/s, {tokens / wall:.1f} answer tokens/s ({wall:.0f} s)")


if __name__ == "__main__":
    main()
