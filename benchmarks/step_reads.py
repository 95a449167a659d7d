"""Reads back to the host per decode step on a real model, per strategy: the device-resident
step promises one (the verdict's copy; an EAGLE-2 tree two: its shape, then the verdict).
On a GPU each read is a sync; on the CPU the same calls run and are counted, but cost nothing.
Beside them, the kernel launches a step makes outside its CUDA graphs (a graph's replay counts
one): on a GPU each costs the host ~5-10 µs. On the CPU, where a graphed computation runs
eagerly, also the operations inside the graphs: the kernels a GPU's replays run a step, each
~1.3-2.8 µs of device time on a small model however it is launched.

    python benchmarks/step_reads.py --device cuda --model smollm2-135m --tokens 48 \
        --strategy "recipe=recipes/smollm2-135m" --strategy "proposer=ngram gamma=4"

Prints a markdown table: strategy, steps, reads per step (median and max), launches per step
(median and max), and on the CPU operations inside graphs per step (median). On the CPU the
launches include host-side work (a GPU's staging in pinned memory); `--simulated-cuda` runs the
strategies with `device=cuda` on the simulated GPU (tests/cuda_sim.py) and counts the launches
a GPU would make alone (not the reads, which the simulation dispatches twice).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

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
    parser.add_argument("--simulated-cuda", action="store_true",
                        help="device=cuda on the simulated GPU: the launches a GPU would make")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        counter = None
        if args.simulated_cuda:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from cuda_sim import device_launches, simulated_cuda

            stack.enter_context(simulated_cuda())
            args.device, counter = "cuda", device_launches
        table(args, counter)


def table(args, counter) -> None:
    prompt = load_prompts("dev", categories=["code"])[0]
    inside = args.device == "cpu"  # a GPU's replays dispatch nothing to count
    print("| strategy | steps | reads per step (median) | max | launches per step (median) | max |"
          + (" inside graphs (median) |" if inside else ""))
    print("|---|---|---|---|---|---|" + ("---|" if inside else ""))
    for strategy in args.strategy or ["proposer=ngram gamma=4"]:
        cfg = compose([f"model={args.model}", f"device={args.device}", *strategy.split()])
        pipeline = Pipeline.from_config(cfg)
        request = Request(pipeline.encode(prompt["messages"]), args.tokens)
        reads, launches, kernels = zip(*per_step(Decoder(pipeline, 1), [request], counter))
        # the simulation dispatches each read twice: the CPU's run counts them
        read = "- | -" if counter is not None else f"{statistics.median(reads):g} | {max(reads)}"
        print(f"| {strategy} | {len(launches)} | {read} | {statistics.median(launches):g} | {max(launches)} |"
              + (f" {statistics.median(kernels):g} |" if inside else ""), flush=True)


if __name__ == "__main__":
    main()
