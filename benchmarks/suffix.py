"""Suffix decoding vs prompt lookup vs the plain target, per category, on a workload served twice.

    python benchmarks/suffix.py --model smollm2-135m [--per-category 2] [--tokens 128]
                                [--gamma-ngram 4] [--gamma-suffix 8] [--passes 2]
                                [--head-recipe recipes/smollm2-135m/eagle.yaml]

One process, one target (its configured precision, native engine), greedy. Each pass serves the
dev prompts (`--per-category` of each category) in order; for every prompt the plain target,
proposer=ngram and proposer=suffix run one after the other, so each speedup divides two runs of
the same prompt in the same pass. The suffix proposer keeps its global tree across prompts and
passes (what a server would): on the second pass it has seen every answer once. Prints one line
per run and, per pass, a table: tokens/s of the plain target, each proposer's speedup (mean of
per-prompt speedups), τ and whether every greedy output equals the plain target's.

With --head-recipe (a recipe of EAGLE or EAGLE-3 heads), that recipe runs too, once with
each lookup before its head (`proposer.lookup=ngram` and `=suffix`, whose global tree, like
proposer=suffix's, keeps every answer it served).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from specpipe.config import compose
from specpipe.controllers.fixed import FixedGamma
from specpipe.exactness import first_divergence
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.proposers import suffix
from specpipe.proposers.ngram import NgramProposer
from specpipe.verifiers.greedy import GreedyVerifier

CATEGORIES = ["code", "code-edit", "chat", "summarize", "math", "multiturn"]


def pipelines(args) -> dict[str, Pipeline]:
    plain = Pipeline.from_config(compose([f"model={args.model}", "proposer=none"]))
    def on_target(proposer, gamma):
        return Pipeline(plain.target, proposer, GreedyVerifier(), FixedGamma(gamma, 1, gamma), runner=plain.runner)
    return {"plain": plain,
            f"ngram γ={args.gamma_ngram}": on_target(NgramProposer(4, 2), args.gamma_ngram),
            f"suffix γ≤{args.gamma_suffix}": on_target(suffix.build(
                context=None, tree=not args.chain, min_token_prob=args.min_token_prob,
                max_spec_factor=args.max_spec_factor), args.gamma_suffix),
            **{f"head+{lookup}": Pipeline.from_config(compose([f"recipe={args.head_recipe}",
                                                               f"proposer.lookup={lookup}"]))
               for lookup in (("ngram", "suffix") if args.head_recipe else ())}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--gamma-ngram", type=int, default=4)
    parser.add_argument("--gamma-suffix", type=int, default=8)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--chain", action="store_true", help="suffix drafts its best path only")
    parser.add_argument("--min-token-prob", type=float, default=0.1)
    parser.add_argument("--max-spec-factor", type=float, default=1.0)
    parser.add_argument("--categories", nargs="+", default=CATEGORIES)
    parser.add_argument("--head-recipe", help="also this recipe of heads, with an ngram and with a suffix lookup")
    args = parser.parse_args()
    torch.manual_seed(0)
    pipes = pipelines(args)
    prompts = [p for c in args.categories for p in load_prompts("dev", [c])[: args.per_category]]
    plain = pipes["plain"]
    plain.run(plain.encode(prompts[0]["messages"]), max_new_tokens=8, speculative=False)  # warm-up
    for served in range(1, args.passes + 1):
        rows = defaultdict(list)  # (category, name) -> (speedup, τ, exact, plain tok/s)
        for prompt in prompts:
            ids = plain.encode(prompt["messages"])
            reference = plain.run(ids, max_new_tokens=args.tokens, speculative=False)
            for name, pipe in pipes.items():
                gen = reference if name == "plain" else pipe.run(ids, max_new_tokens=args.tokens)
                exact = first_divergence(plain.runner, ids, gen.token_ids, reference.token_ids) is None
                speedup = gen.stats.tokens_per_s / reference.stats.tokens_per_s
                rows[prompt["category"], name].append((speedup, gen.stats.mean_accepted_length, exact,
                                                       reference.stats.tokens_per_s))
                print(f"pass {served} {prompt['id']:14s} {name:12s} {gen.stats.tokens_per_s:7.2f} tok/s "
                      f"x{speedup:.2f} τ={gen.stats.mean_accepted_length:.2f} exact={'yes' if exact else 'NO'} "
                      f"propose {gen.stats.propose_s:.2f}s verify {gen.stats.verify_s:.2f}s", flush=True)
        table(rows, pipes, served, args)


def table(rows, pipes, served: int, args) -> None:
    names = [n for n in pipes if n != "plain"]
    print(f"\n{args.model}, pass {served} of {args.passes}, {args.tokens} tokens, greedy")
    print("| category | plain tok/s | " + " | ".join(f"{n} speedup (τ)" for n in names) + " | exact |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for category in [*args.categories, "overall"]:
        pick = (lambda key: key[0] == category) if category != "overall" else (lambda key: True)
        cells = []
        for name in names:
            items = [item for key, values in rows.items() if pick(key) and key[1] == name for item in values]
            cells.append(f"{statistics.mean(s for s, *_ in items):.2f}x ({statistics.mean(t for _, t, *_ in items):.2f})")
        base = [item for key, values in rows.items() if pick(key) and key[1] == "plain" for item in values]
        exact = [item[2] for key, values in rows.items() if pick(key) and key[1] != "plain" for item in values]
        print(f"| {category} | {statistics.mean(b[3] for b in base):.1f} | " + " | ".join(cells)
              + f" | {sum(exact)}/{len(exact)} |")


if __name__ == "__main__":
    main()
