"""A draft with another tokenizer vs the same-family sibling, on one target, per category.

    python benchmarks/cross_tokenizer.py [--target qwen2.5-coder-1.5b] [--drafts qwen2.5-coder-0.5b smollm2-135m]
                                         [--per-category 1] [--tokens 96] [--gamma 4]

One process, greedy, native engine, every pipeline on the same target runner: per prompt the
plain target runs, then each draft (proposer=draft, its configured precision; a draft whose
tokenizer differs is translated by CrossDrafter). Prints one line per run and a table of
speedups (mean of per-prompt speedups over the plain run of the same prompt), τ, acceptance and
exactness against the plain target.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from specpipe.build import checked_context
from specpipe.components import call_target
from specpipe.config import compose
from specpipe.controllers.fixed import FixedGamma
from specpipe.exactness import first_divergence
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.verifiers.greedy import GreedyVerifier

CATEGORIES = ["code", "code-edit", "chat", "summarize", "math", "multiturn"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafts", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    plain = Pipeline.from_config(compose([f"model={args.target}", "proposer=none"]))
    pipes = {}
    for draft in args.drafts:
        cfg = compose([f"model={args.target}", "proposer=draft", f"proposer.model={draft}", f"gamma={args.gamma}"])
        context, checks = checked_context(cfg)
        print(f"{draft}: " + next(c.why for c in checks if c.name == "tokenizer"), flush=True)
        proposer = call_target(cfg.proposer, "proposer", context)
        pipes[f"{draft} ({type(proposer).__name__})"] = Pipeline(
            plain.target, proposer, GreedyVerifier(), FixedGamma(args.gamma, 1, args.gamma), runner=plain.runner)
    prompts = [p for c in CATEGORIES for p in load_prompts("dev", [c])[: args.per_category]]
    plain.run(plain.encode(prompts[0]["messages"]), max_new_tokens=8, speculative=False)  # warm-up
    rows = defaultdict(list)
    for prompt in prompts:
        ids = plain.encode(prompt["messages"])
        reference = plain.run(ids, max_new_tokens=args.tokens, speculative=False)
        for name, pipe in pipes.items():
            gen = pipe.run(ids, max_new_tokens=args.tokens)
            exact = first_divergence(plain.runner, ids, gen.token_ids, reference.token_ids) is None
            speedup = gen.stats.tokens_per_s / reference.stats.tokens_per_s
            rows[name].append((prompt["category"], speedup, gen.stats, exact, reference.stats.tokens_per_s))
            print(f"{prompt['id']:14s} {name:36s} plain {reference.stats.tokens_per_s:6.2f} tok/s  "
                  f"{gen.stats.tokens_per_s:6.2f} tok/s x{speedup:.2f} τ={gen.stats.mean_accepted_length:.2f} "
                  f"exact={'yes' if exact else 'NO'}", flush=True)
    print(f"\n{args.target}, γ={args.gamma}, {args.tokens} tokens, greedy")
    print("| draft | " + " | ".join(CATEGORIES) + " | overall speedup | τ | acceptance | exact |")
    print("|---|" + "---|" * len(CATEGORIES) + "---|---|---|---|")
    for name, items in rows.items():
        per = [statistics.mean(s for c, s, *_ in items if c == category) for category in CATEGORIES]
        print(f"| {name} | " + " | ".join(f"{x:.2f}x" for x in per)
              + f" | {statistics.mean(s for _, s, *_ in items):.2f}x"
              f" | {statistics.mean(st.mean_accepted_length for _, _, st, *_ in items):.2f}"
              f" | {statistics.mean(st.acceptance_rate for _, _, st, *_ in items):.2f}"
              f" | {sum(e for *_, e, _ in items)}/{len(items)} |")
    print(f"plain tok/s (mean): {statistics.mean(i[-1] for i in next(iter(rows.values()))):.2f}")


if __name__ == "__main__":
    main()
