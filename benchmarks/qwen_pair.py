"""The Qwen2.5-Coder pair on code prompts, greedy, all in one process.

    python benchmarks/qwen_pair.py [--prompts 4] [--tokens 128] [--gamma-draft 4] [--gamma-twin 4]

Target qwen2.5-coder-1.5b at its configured precision (fp16 weights: batch-invariant); runs,
per prompt and interleaved: the plain target, proposer=draft (qwen2.5-coder-0.5b, int8),
proposer=twin (int8), and transformers' own assisted generation with the same two models at
the same precisions (the peer). Prints tokens/s, speedup against the plain target of the same
prompt, acceptance rate, τ and per-position acceptance, and whether each greedy output equals
the plain target's.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from specpipe.controllers.fixed import FixedGamma
from specpipe.exactness import first_divergence
from specpipe.models.loader import load
from specpipe.models.quantize import quantize_model
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier

GREEDY = SamplingParams()


def build(args):
    target = load("qwen2.5-coder-1.5b")
    twin_model = quantize_model(copy.deepcopy(target.model), "int8")
    quantize_model(target.model, args.target_precision)
    draft_model = quantize_model(load("qwen2.5-coder-0.5b").model, "int8")
    pipelines = {
        "plain": Pipeline(target, None, GreedyVerifier(), None),
        "draft": Pipeline(target, ModelDrafter(draft_model, GREEDY), GreedyVerifier(), FixedGamma(args.gamma_draft)),
        "twin": Pipeline(target, ModelDrafter(twin_model, GREEDY), GreedyVerifier(), FixedGamma(args.gamma_twin)),
    }
    return target, draft_model, pipelines


def hf_assisted(target, draft_model, ids: list[int], tokens: int) -> tuple[list[int], float]:
    """transformers' assisted generation (its default assistant schedule), greedy."""
    input_ids = torch.tensor([ids])
    start = time.perf_counter()
    out = target.model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft_model,
        max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
    )
    elapsed = time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    return new, len(new) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--gamma-draft", type=int, default=4)
    parser.add_argument("--gamma-twin", type=int, default=4)
    parser.add_argument("--target-precision", default="fp16")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    target, draft_model, pipelines = build(args)
    prompts = load_prompts("dev", ["code"])[: args.prompts]
    rows = {name: [] for name in [*pipelines, *([] if args.no_peer else ["hf-assisted"])]}
    for prompt in prompts:
        ids = pipelines["plain"].encode(prompt["messages"])
        pipelines["plain"].run(ids, max_new_tokens=4, speculative=False)  # warm-up
        results = {}
        for name, pipe in pipelines.items():
            gen = pipe.run(ids, max_new_tokens=args.tokens, speculative=name != "plain")
            results[name] = gen
        plain = results["plain"]
        for name, gen in results.items():
            div = first_divergence(pipelines["plain"].runner, ids, gen.token_ids, plain.token_ids)
            rows[name].append((prompt["id"], gen.stats, div))
            print(f"{prompt['id']} {name:6s} {gen.stats.tokens_per_s:6.2f} tok/s  "
                  f"x{gen.stats.tokens_per_s / plain.stats.tokens_per_s:.2f}  τ={gen.stats.mean_accepted_length:.2f} "
                  f"acc={gen.stats.acceptance_rate:.2f} exact={'yes' if div is None else div}", flush=True)
        if not args.no_peer:
            new, tps = hf_assisted(target, draft_model, ids, len(plain.token_ids))
            exact = new == plain.token_ids
            rows["hf-assisted"].append((prompt["id"], tps, exact))
            print(f"{prompt['id']} hf-assisted {tps:6.2f} tok/s  x{tps / plain.stats.tokens_per_s:.2f} "
                  f"exact={'yes' if exact else 'no'}", flush=True)
    summarize(rows, args)


def summarize(rows: dict, args) -> None:
    plain = [s.tokens_per_s for _, s, _ in rows["plain"]]
    print("\n| configuration | tokens/s (mean) | speedup (median, min-max) | acceptance | τ | per-position acceptance | exact |")
    print("|---|---|---|---|---|---|---|")
    for name, items in rows.items():
        if name == "hf-assisted":
            tps = [t for _, t, _ in items]
            exact = sum(e for _, _, e in items)
            acc = tau = pos = "-"
        else:
            tps = [s.tokens_per_s for _, s, _ in items]
            exact = sum(d is None for _, _, d in items)
            acc = f"{statistics.mean(s.acceptance_rate for _, s, _ in items):.2f}" if name != "plain" else "-"
            tau = f"{statistics.mean(s.mean_accepted_length for _, s, _ in items):.2f}"
            pos = " ".join(f"{statistics.mean(p):.2f}" for p in zip(*(s.per_position_acceptance for _, s, _ in items))) or "-"
        speedups = [t / p for t, p in zip(tps, plain)]
        gamma = {"draft": args.gamma_draft, "twin": args.gamma_twin}.get(name)
        label = name + (f" γ={gamma}" if gamma else "")
        print(f"| {label} | {statistics.mean(tps):.2f} | {statistics.median(speedups):.2f}x "
              f"({min(speedups):.2f}-{max(speedups):.2f}) | {acc} | {tau} | {pos} | {exact}/{len(items)} |")


if __name__ == "__main__":
    main()
