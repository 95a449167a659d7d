"""γ controllers: fixed γ in {2, 4, 6} against each adaptive controller, per prompt category.

    python benchmarks/controllers.py --model smollm2-135m --proposer ngram --categories code-edit chat --prompts 3
    python benchmarks/controllers.py --model qwen2.5-coder-1.5b --proposer draft --categories code-edit chat --prompts 2
    python benchmarks/controllers.py --recipe recipes/smollm2-135m/eagle3.yaml --only "fixed γ=2" cost

Everything runs in one process on one loaded target, after one warm-up generation per
controller: per prompt, the plain target, every controller, then the plain target again (its
mean tokens/s is the baseline, so drift of the machine during the block cancels out); greedy. Prints tokens/s, speedup over the plain target of the same
prompt (median per category), acceptance, τ, the γ trace summary, and exactness.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from specpipe.config import compose
from specpipe.exactness import first_divergence
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts

CONTROLLERS = {
    "fixed γ=1": ["controller=fixed", "gamma=1"],
    "fixed γ=2": ["controller=fixed", "gamma=2"],
    "fixed γ=3": ["controller=fixed", "gamma=3"],
    "fixed γ=4": ["controller=fixed", "gamma=4"],
    "fixed γ=6": ["controller=fixed", "gamma=6"],
    "heuristic": ["controller=heuristic", "gamma=4"],
    "band": ["controller=band", "gamma=4"],
    "confidence": ["controller=confidence", "gamma_max=6"],
    "cost": ["controller=cost", "gamma=4"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--proposer", default="ngram")
    parser.add_argument("--recipe", help="a recipe yaml (a trained head's): its proposer instead of --proposer")
    parser.add_argument("--categories", nargs="+", default=["code-edit", "chat"])
    parser.add_argument("--prompts", type=int, default=3, help="per category")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--only", nargs="*", help="controllers to run (names as printed)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="blocks per prompt; each block runs the controllers in a rotated order")
    args = parser.parse_args()
    names = args.only or list(CONTROLLERS)
    base = [f"model={args.model}", f"recipe={args.recipe}" if args.recipe else f"proposer={args.proposer}"]
    first = Pipeline.from_config(compose(base + CONTROLLERS[names[0]]))
    pipelines = {n: first if n == names[0] else _sharing(first, base + CONTROLLERS[n]) for n in names}
    rows = defaultdict(list)  # (category, name) -> [(speedup, stats, exact)]
    warm = first.encode(load_prompts("dev", [args.categories[0]])[0]["messages"])
    for pipe in pipelines.values():  # first calls of each block shape pay kernel set-up: not measured
        pipe.run(warm, max_new_tokens=32)
    for category in args.categories:
        for prompt in load_prompts("dev", [category])[: args.prompts]:
            ids = first.encode(prompt["messages"])
            for repeat in range(args.repeats):
                order = names[repeat % len(names):] + names[: repeat % len(names)]
                _block(first, pipelines, order, ids, prompt["id"], category, args.tokens, rows)
    table(rows, args, names)


def _block(first, pipelines, order, ids, prompt_id, category, tokens, rows) -> None:
    """The plain target, every controller in `order`, the plain target again (the machine drifts:
    the mean of the two plain runs is the baseline of this block)."""
    plain = first.run(ids, max_new_tokens=tokens, speculative=False)
    runs = {name: pipelines[name].run(ids, max_new_tokens=tokens) for name in order}
    again = first.run(ids, max_new_tokens=tokens, speculative=False)
    plain_tps = (plain.stats.tokens_per_s + again.stats.tokens_per_s) / 2
    drift = abs(plain.stats.tokens_per_s - again.stats.tokens_per_s) / plain_tps
    rows[category, "(plain vs plain)"].append((again.stats.tokens_per_s / plain.stats.tokens_per_s, None, None))
    for name, gen in runs.items():
        div = first_divergence(first.runner, ids, gen.token_ids, plain.token_ids)
        speedup = gen.stats.tokens_per_s / plain_tps
        rows[category, name].append((speedup, gen.stats, div))
        print(f"{prompt_id:14s} {name:11s} x{speedup:.2f} τ={gen.stats.mean_accepted_length:.2f} "
              f"γ̄={statistics.mean(gen.stats.gamma_trace):.1f} exact={'yes' if div is None else div} "
              f"(plain drift {drift:.0%})", flush=True)


def _sharing(first, overrides):
    """Another controller on the same loaded target and proposer (only the controller differs)."""
    from specpipe.build import checked_context
    from specpipe.components import call_target

    cfg = compose(overrides)
    context, _ = checked_context(cfg)
    controller = call_target(cfg.controller, "controller", context)
    # the same runner: a proposer binds to its pipeline's runner (a head reads its features), so
    # a second runner would rebind the shared proposer away from the first pipeline's
    return Pipeline(first.target, first.proposer, first.verifier, controller, first.sampling, first.chat,
                    runner=first.runner)


def table(rows, args, names) -> None:
    print(f"\n{args.model}, {args.recipe or 'proposer=' + args.proposer}, greedy, {args.tokens} new tokens, "
          f"{args.prompts} prompts per category, {args.repeats} block(s) per prompt")
    print("| category | controller | speedup (median, min-max) | acceptance | τ | mean γ | exact |")
    print("|---|---|---|---|---|---|---|")
    for category in args.categories:
        noise = [s for s, _, _ in rows[category, "(plain vs plain)"]]
        print(f"| {category} | plain, 2nd run / 1st run (the noise) | {statistics.median(noise):.2f}x "
              f"({min(noise):.2f}-{max(noise):.2f}) | | | | |")
        for name in names:
            items = rows[category, name]
            speedups = [s for s, _, _ in items]
            print(f"| {category} | {name} | {statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}) "
                  f"| {statistics.mean(st.acceptance_rate for _, st, _ in items):.2f} "
                  f"| {statistics.mean(st.mean_accepted_length for _, st, _ in items):.2f} "
                  f"| {statistics.mean(statistics.mean(st.gamma_trace) for _, st, _ in items):.1f} "
                  f"| {sum(d is None for _, _, d in items)}/{len(items)} |")


if __name__ == "__main__":
    main()
