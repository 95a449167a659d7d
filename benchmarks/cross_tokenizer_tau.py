"""τ of a draft with another tokenizer, greedy, by each translation (`proposer.translate`): the
shared tokens' table (one host read a step; `auto` takes it on a GPU) against the draft's text
re-tokenised (universal assisted generation; `auto` on the CPU). Counts only, no timing.

    OMP_NUM_THREADS=1 python benchmarks/cross_tokenizer_tau.py [--target qwen2.5-coder-1.5b]
        [--draft smollm2-135m] [--per-category 1] [--tokens 64] [--gamma 4]

Per prompt (the dev prompts of benchmarks/cross_tokenizer.py) the plain target runs, then the
draft by each translation on the same target runner; prints one line per run (steps, accepted,
drafted, τ = emitted / steps, exactness against the plain output) and the means.
"""

from __future__ import annotations

import argparse
import statistics

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
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()
    plain = Pipeline.from_config(compose([f"model={args.target}", "proposer=none"]))
    pipes = {}
    for translate in ("text", "shared"):  # the two ways (auto is one of them, by device)
        cfg = compose([f"model={args.target}", "proposer=draft", f"proposer.model={args.draft}",
                       f"gamma={args.gamma}", f"proposer.translate={translate}"])
        context, _ = checked_context(cfg)
        proposer = call_target(cfg.proposer, "proposer", context)
        pipes[translate] = Pipeline(plain.target, proposer, GreedyVerifier(),
                                    FixedGamma(args.gamma, 1, args.gamma), runner=plain.runner)
    prompts = [p for c in CATEGORIES for p in load_prompts("dev", [c])[: args.per_category]]
    rows = {translate: [] for translate in pipes}
    for prompt in prompts:
        ids = plain.encode(prompt["messages"])
        reference = plain.run(ids, max_new_tokens=args.tokens, speculative=False)
        for translate, pipe in pipes.items():
            gen = pipe.run(ids, max_new_tokens=args.tokens)
            exact = first_divergence(plain.runner, ids, gen.token_ids, reference.token_ids) is None
            stats = gen.stats
            rows[translate].append((stats, exact))
            print(f"{prompt['id']:14s} translate={translate:6s} steps {stats.steps:3d} accepted {stats.accepted:3d} "
                  f"drafted {stats.drafted:3d} τ {stats.mean_accepted_length:.2f} exact={'yes' if exact else 'NO'}",
                  flush=True)
    print(f"\n{args.target} drafted by {args.draft}, γ={args.gamma}, {args.tokens} tokens, greedy")
    for translate, items in rows.items():
        stats = [s for s, _ in items]
        print(f"translate={translate}: τ {statistics.mean(s.mean_accepted_length for s in stats):.3f}, accepted a step "
              f"{statistics.mean(s.accepted / s.steps for s in stats):.3f}, acceptance "
              f"{statistics.mean(s.acceptance_rate for s in stats):.3f}, exact {sum(e for _, e in items)}/{len(items)}")


if __name__ == "__main__":
    main()
