"""Reads back to the host per decode step on a real model, per strategy: the device-resident
step promises one (the verdict's copy; an EAGLE-2 tree two: its shape, then the verdict).
On a GPU each read is a sync; on the CPU the same calls run and are counted, but cost nothing.
Beside them, the kernel launches a step makes outside its CUDA graphs (a graph's replay counts
one): on a GPU each costs the host ~5-10 µs.

    python benchmarks/step_reads.py --device cuda --model smollm2-135m --tokens 48 \
        --strategy "recipe=recipes/smollm2-135m" --strategy "proposer=ngram gamma=4"

Prints a markdown table: strategy, steps, reads per step (median and max), launches per step
(median and max).
"""

from __future__ import annotations

import argparse
import statistics

from specpipe.config import compose
from specpipe.decode.loop import Decoder
from specpipe.decode.syncs import per_step
from specpipe.pipeline import Pipeline, Request
from specpipe.prompts import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--strategy", action="append", default=[], help="overrides, space-separated")
    args = parser.parse_args()
    prompt = load_prompts("dev", categories=["code"])[0]
    print("| strategy | steps | reads per step (median) | max | launches per step (median) | max |")
    print("|---|---|---|---|---|---|")
    for strategy in args.strategy or ["proposer=ngram gamma=4"]:
        cfg = compose([f"model={args.model}", f"device={args.device}", *strategy.split()])
        pipeline = Pipeline.from_config(cfg)
        request = Request(pipeline.encode(prompt["messages"]), args.tokens)
        reads, launches = zip(*per_step(Decoder(pipeline, 1), [request]))
        print(f"| {strategy} | {len(reads)} | {statistics.median(reads):g} | {max(reads)} | "
              f"{statistics.median(launches):g} | {max(launches)} |", flush=True)


if __name__ == "__main__":
    main()
