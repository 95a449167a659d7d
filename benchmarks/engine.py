"""The engine table of docs/benchmarks.md: ms per forward and plain decode tok/s, per engine and
precision, with llama.cpp's plain decoding of the same GGUF file as the absolute anchor.

    python benchmarks/engine.py --models smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b \
        --configs native:fp16 native:w8a16 native:bf16 hf:fp16 --prompts 3 --tokens 64 --llama-cpp

A configuration is engine:precision, plus `+compile` (torch.compile), `+graphs` (the static step:
CUDA graphs on a GPU, eager fixed shapes on the CPU; kernels=exact, every forward padded to the
planned block `--block`, or `@N` after the configuration) or `+graphs+fast` (kernels=fast: the
fewest rows, blocks padded to a power of two up to the plan). Without `+graphs` the eager forward
runs on every device. `+sequential` decodes plainly with `overlap=off` (each step read before the
next is queued; the default overlaps them on a GPU).

Per model, one process, one thing at a time (never time with another heavy job running):
- forward ms: a k-token forward (k = 1, 2, 5, 9, 16) appended to a 64-token cache, median of
  reps; "5/1" and "9/1" are the 5- and 9-token verifies' costs over a 1-token step. With
  `+graphs` a k wider than `--block` runs the eager forward (a prompt's path): marked `*`.
- plain tok/s: `Pipeline.run(speculative=False)` over the first prompts of the dev set's code,
  code-edit and chat categories, greedy: the steps' time (the figure specpipe's bench reports:
  each step and the host's work between steps) and wall time (the whole generate loop, its last
  step's emission included).
- llama.cpp (llama-cpp-python, 2 threads, the zoo's GGUF: Q4_1 / Q4 / Q4_K_M): decode tok/s
  over the same prompt tokens, prompt evaluation excluded.
Writes the table to stdout and the figures to --out (JSON).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from specpipe.engine import make_runner
from specpipe.models import zoo
from specpipe.models.loader import load
from specpipe.pipeline import Pipeline, encode
from specpipe.prompts import load_prompts
from specpipe.verifiers.greedy import GreedyVerifier

BLOCKS = (1, 2, 5, 9, 16)


def forward_ms(runner, context: list[int], k: int, reps: int) -> float:
    """Median ms of a k-token forward appended to `context` (its logits stay on the device: on a
    GPU the clock waits for the device before and after)."""
    runner.reset()
    runner.prefill(0, context[:-1])
    block = torch.tensor([context[-1:] + list(range(100, 99 + k))]).to(runner.device)  # [1, k]
    times = []
    for _ in range(reps):
        runner.crop(0, len(context) - 1)
        _sync(runner.device)
        started = time.perf_counter()
        runner.forward(block)
        _sync(runner.device)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_decode(target, runner, prompts: list[list[int]], tokens: int, overlap: str = "auto") -> tuple[float, float]:
    """(step tok/s, wall tok/s), both pooled over the prompts."""
    pipe = Pipeline(target, None, GreedyVerifier(), None, runner=runner, overlap=overlap)
    pipe.run(prompts[0], max_new_tokens=4, speculative=False)  # warm-up
    emitted = step_s = wall_s = 0.0
    for ids in prompts:
        started = time.perf_counter()
        gen = pipe.run(ids, max_new_tokens=tokens, speculative=False)
        wall_s += time.perf_counter() - started - gen.stats.prefill_s
        emitted += gen.stats.emitted
        step_s += gen.stats.decode_s
    return emitted / step_s, emitted / wall_s


def llama_cpp_decode(name: str, prompts: list[list[int]], tokens: int) -> float | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(zoo.fetch(name)), n_threads=2, n_ctx=2048, verbose=False)
    emitted, seconds = 0, 0.0
    for index, ids in enumerate([prompts[0], *prompts]):  # the first run warms up
        llm.reset()
        first = None
        count = 0
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            count += 1
            if first is None:
                first = time.perf_counter()  # prompt evaluated, first token out
            if count == tokens:
                break
        if index > 0:
            seconds += time.perf_counter() - first
            emitted += count - 1
    return emitted / seconds


def load_target(name: str, random_weights: bool):
    """The zoo model, or (--random-weights, for machines that cannot download) a model of the
    same shape with random weights, from benchmarks/shapes/NAME.json: timings do not depend on
    the values, only the output text does."""
    if not random_weights:
        return load(name)
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from specpipe.models.loader import LoadedModel

    shapes = Path(__file__).parent / "shapes"
    config = AutoConfig.from_pretrained(shapes / f"{name}.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(shapes / "tiny-tokenizer.json"))
    return LoadedModel(name, AutoModelForCausalLM.from_config(config).eval(), tokenizer)


def measure_model(name: str, configs: list[str], args) -> list[dict]:
    target = load_target(name, args.random_weights)
    sets = [p for c in ("code", "code-edit", "chat") for p in load_prompts("dev", [c])[: args.prompts]]
    if args.random_weights:  # no real tokenizer: fixed token ids of the same lengths
        prompts = [[(13 * i + 7 * j) % 1000 + 10 for j in range(60)] for i in range(len(sets))]
    else:
        prompts = [encode(target.tokenizer, p["messages"], bool(target.tokenizer.chat_template)) for p in sets]
    context = (prompts[0] * 8)[:64]
    rows = []
    # native configurations first: they copy the weights, so the hf ones may quantize in place after
    for config in sorted(configs, key=lambda c: c.startswith("hf")):
        setting, _, block = config.partition("@")
        block = int(block) if block else args.block
        engine, _, precision = setting.partition(":")
        precision, *extras = precision.split("+")
        model = copy.deepcopy(target.model) if engine == "hf" and args.copy_hf else target.model
        started = time.perf_counter()
        runner = make_runner(model, engine=engine, precision=precision, compile="compile" in extras,
                             device=args.device, graphs="on" if "graphs" in extras else "off",
                             kernels="fast" if "fast" in extras else "exact")
        runner.plan(block)  # a static step's blocks (what a pipeline of γ = block - 1 plans)
        forward_ms(runner, context, 1, 1)  # first call: compile or cache load
        first_call_s = time.perf_counter() - started
        reps = 5 if "1.5b" in name else 9
        ms = {k: forward_ms(runner, context, k, reps) for k in BLOCKS}
        step_tps, wall_tps = plain_decode(target, runner, prompts, args.tokens,
                                          "off" if "sequential" in extras else "auto")
        memory = runner.memory()
        eager = [k for k in BLOCKS if "graphs" in extras and k > block]  # past the plan: the eager forward
        rows.append({"model": name, "config": config, "ms": ms, "verify_5_over_1": ms[5] / ms[1],
                     "verify_9_over_1": ms[9] / ms[1], "block": block, "eager_k": eager,
                     "plain_tok_s": step_tps, "plain_wall_tok_s": wall_tps, "first_call_s": first_call_s,
                     "weights_mib": memory.weights / 2**20, "cache_mib": memory.cache / 2**20,
                     "step": runner.step,
                     "graphs_captured": runner.static.captures if getattr(runner, "static", None) else 0})
        print(_line(rows[-1]), flush=True)
        del runner
        gc.collect()
    if args.llama_cpp and not args.random_weights:
        tps = llama_cpp_decode(name, prompts, args.tokens)
        if tps is not None:
            rows.append({"model": name, "config": "llama.cpp", "plain_tok_s": tps})
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    ms = row.get("ms")
    cols = [row["model"], row["config"]]
    eager = {int(k) for k in row.get("eager_k", [])}
    cols += [f"{ms[k]:.3g}" + ("*" if k in eager else "") for k in BLOCKS] if ms else ["-"] * len(BLOCKS)
    cols += [f"{row['verify_5_over_1']:.2f}" if ms else "-", f"{row['verify_9_over_1']:.2f}" if ms else "-",
             f"{row['plain_tok_s']:.1f}",
             f"{row['plain_wall_tok_s']:.1f}" if ms else "-",
             f"{row['weights_mib']:.0f} + {row['cache_mib']:.0f}" if ms else "-"]
    return "| " + " | ".join(cols) + " |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["smollm2-135m"])
    parser.add_argument("--configs", nargs="+", default=["native:fp16", "hf:fp16"],
                        help="engine:precision[+compile][+graphs[+fast]][+sequential][@block], e.g. "
                             "native:fp16+compile, native:bf16+graphs@5")
    parser.add_argument("--block", type=int, default=max(BLOCKS),
                        help="+graphs: the planned block (kernels=exact pads every forward to it)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per category (code, code-edit, chat)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--llama-cpp", action="store_true", help="also llama.cpp's plain decode (peers extra)")
    parser.add_argument("--copy-hf", action="store_true", help="give each hf configuration its own copy")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (native engine, precisions none / bf16)")
    parser.add_argument("--random-weights", action="store_true",
                        help="random weights of the models' shapes (benchmarks/shapes/): no download")
    parser.add_argument("--out", default="bench-results/engine.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| model | engine:precision | ms k=1 | k=2 | k=5 | k=9 | k=16 | 5/1 | 9/1 | plain tok/s | wall tok/s "
          "| MiB weights + cache |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.models:
        rows += measure_model(name, args.configs, args)
        gc.collect()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
