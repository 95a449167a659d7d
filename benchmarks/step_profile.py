"""Where a decode step's time goes: the torch profiler over one generation, per strategy.

    python benchmarks/step_profile.py --device cuda --model smollm2-135m --tokens 64 \
        --strategy "plain graphs=off" --strategy "plain" --strategy "recipe=recipes/smollm2-135m"

A strategy is overrides, space-separated; a leading `plain` decodes without speculation. Each
runs once unprofiled (CUDA graphs captured, kernels set up), then once under
`torch.profiler`. Printed per strategy, a step being one decode step (a plain token, or a
draft and its verification): steps; decode ms a step (the pipeline's own timer: CUDA events on
a GPU); on a GPU the device's busy ms a step (the sum of its kernels' and copies' times), the
share of the decode time the device sat idle (launch gaps, host work it waited on), kernels,
CUDA graph launches and host-to-device / device-to-host copies a step, and the three kernels
that took longest in all; on the CPU the operators a step and the three costliest (no device).
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from specpipe.config import compose
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts


def _self_device_us(event) -> float:
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))


def _is_device(event) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def summary(events, steps: int, decode_s: float, device: str) -> str:
    """One table row from the profiler's `key_averages()`."""
    per = max(steps, 1)
    if device != "cuda":
        ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
        count = sum(e.count for e in events)
        top = ", ".join(f"{e.key} {e.self_cpu_time_total / 1000:.0f} ms" for e in ops[:3])
        return f"{steps} | {decode_s * 1000 / per:.2f} | - | - | {count / per:.0f} operators | - | - | {top}"
    kernels = [e for e in events if _is_device(e)]
    busy_us = sum(_self_device_us(e) for e in kernels)
    launches = sum(e.count for e in events if e.key == "cudaGraphLaunch")
    copies = {kind: sum(e.count for e in kernels if kind in e.key) for kind in ("HtoD", "DtoH")}
    idle = 1 - busy_us / 1e6 / decode_s if decode_s > 0 else float("nan")
    top = ", ".join(f"{e.key[:40]} {_self_device_us(e) / 1000:.1f} ms"
                    for e in sorted(kernels, key=_self_device_us, reverse=True)[:3])
    return (f"{steps} | {decode_s * 1000 / per:.3f} | {busy_us / 1000 / per:.3f} | {idle:.0%} | "
            f"{sum(e.count for e in kernels) / per:.0f} | {launches / per:.1f} | "
            f"{copies['HtoD'] / per:.1f} / {copies['DtoH'] / per:.1f} | {top}")


def profiled(pipeline: Pipeline, ids: list[int], tokens: int, speculative: bool, device: str):
    """(key averages, steps, decode seconds) of one generation, after one unprofiled run."""
    pipeline.run(ids, max_new_tokens=tokens, speculative=speculative)  # captures, set-up, caches
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        gen = pipeline.run(ids, max_new_tokens=tokens, speculative=speculative)
        if device == "cuda":
            torch.cuda.synchronize()
    return prof.key_averages(), gen.stats.steps, gen.stats.decode_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--strategy", action="append", default=[], help="overrides, space-separated")
    args = parser.parse_args()
    prompt = load_prompts("dev", categories=["code"])[0]
    print("| strategy | steps | decode ms a step | device busy ms a step | device idle | kernels a step "
          "| graph launches a step | copies a step (to device / to host) | longest kernels |")
    print("|---|---|---|---|---|---|---|---|---|")
    for strategy in args.strategy or ["plain"]:
        words = strategy.split()
        plain = words[:1] == ["plain"]
        cfg = compose([f"model={args.model}", f"device={args.device}", *words[plain:]])
        pipeline = Pipeline.from_config(cfg)
        ids = pipeline.encode(prompt["messages"])
        speculative = not plain and pipeline.proposer is not None
        events, steps, decode_s = profiled(pipeline, ids, args.tokens, speculative, args.device)
        print(f"| {strategy} | {summary(events, steps, decode_s, args.device)} |", flush=True)
        del pipeline


if __name__ == "__main__":
    main()
