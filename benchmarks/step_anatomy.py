"""Where a pipeline's steps go: several proposer settings on one target, per step.

Usage: python benchmarks/step_anatomy.py --base='KEY=VALUE ...' NAME='KEY=VALUE ...' [NAME=...]
       [--prompts=dev] [--categories=code,code-edit,chat,summarize,math] [--limit=2] [--tokens=96]
e.g.   python benchmarks/step_anatomy.py --base='model=qwen2.5-coder-1.5b model.quantize=bf16' \\
         head='recipe=recipes/qwen2.5-coder-1.5b/eagle3.yaml' \\
         draft='proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4 controller=fixed'

The target loads once (from the first setting) and every setting's proposer and controller are
built beside it, so all rows share one target object, one precision and one machine state. Per
prompt the plain target runs once, then each setting. Printed per setting: median and mean
speedup (decode tokens/s against the plain run), τ, exactness, speedup per category, the step
cost in plain steps by γ, and, for heads with `proposer.lookup`, the steps the lookup drafted
apart from the head's (γ and tokens emitted). It is an exploration aid: the per-run tables of
docs/benchmarks.md come from `specpipe bench`, one setting a process. Run it alone on the machine.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from collections import defaultdict

from specpipe import compose
from specpipe.build import checked_context
from specpipe.components import call_target
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts
from specpipe.proposers.ngram import NgramProposer


def pipelines(base: list[str], settings: dict[str, list[str]]) -> dict[str, Pipeline]:
    """One pipeline per setting, all on the first one's target runner."""
    out: dict[str, Pipeline] = {}
    first = None
    for name, overrides in settings.items():
        cfg = compose(base + overrides)
        if first is None:
            first = out[name] = Pipeline.from_config(cfg)
            continue
        context, _ = checked_context(cfg)
        context._target = first.target  # the loaded target: not a second copy
        proposer = call_target(cfg.proposer, "proposer", context)
        controller = call_target(cfg.controller, "controller", context)
        out[name] = Pipeline(first.target, proposer, first.verifier, controller, first.sampling, runner=first.runner)
    return out


class SourceLog:
    """Which of a head's two sources drafted each step: 'L' the prompt lookup, 'H' the head."""

    def __init__(self, pipes: dict[str, Pipeline]):
        self.steps: list[str] = []
        for pipe in pipes.values():
            lookup = getattr(pipe.proposer, "lookup", None)
            if isinstance(lookup, NgramProposer):  # a head's (proposer=ngram's own `lookup` is its method)
                lookup.lookup = self._wrap(lookup.lookup)

    def _wrap(self, lookup):
        """The head asks its lookup first in every step it drafts; a match is the step's draft."""
        def tagged(*args, **kwargs):  # the lookup's own signature (committed, gamma, row, trees)
            copied = lookup(*args, **kwargs)
            self.steps.append("L" if copied is not None else "H")
            return copied
        return tagged


def main() -> None:
    flags = {a[2:].split("=", 1)[0]: a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--") and "=" in a}
    base = shlex.split(flags.get("base", ""))
    settings = {a.split("=", 1)[0]: shlex.split(a.split("=", 1)[1]) for a in sys.argv[1:] if not a.startswith("--")}
    if not settings:
        sys.exit(__doc__)
    categories = flags.get("categories", "code,code-edit,chat,summarize,math").split(",")
    limit, tokens = int(flags.get("limit", 2)), int(flags.get("tokens", 96))
    by_category = defaultdict(list)
    for prompt in load_prompts(flags.get("prompts", "dev"), categories):
        by_category[prompt["category"]].append(prompt)
    prompts = [p for c in categories for p in by_category[c][:limit]]

    pipes = pipelines(base, settings)
    plain_pipe = next(iter(pipes.values()))
    log = SourceLog(pipes)
    warm = plain_pipe.encode(prompts[0]["messages"])
    plain_pipe.run(warm, max_new_tokens=24, speculative=False)
    for pipe in pipes.values():
        pipe.run(warm, max_new_tokens=24)

    rows = []
    for prompt in prompts:
        ids = plain_pipe.encode(prompt["messages"])
        plain = plain_pipe.run(ids, max_new_tokens=tokens, speculative=False)
        row = {"category": prompt["category"], "plain_step_s": 1 / plain.stats.tokens_per_s}
        for name, pipe in pipes.items():
            log.steps.clear()
            gen = pipe.run(ids, max_new_tokens=tokens)
            row[name] = (gen.stats, gen.token_ids == plain.token_ids, "".join(log.steps))
        rows.append(row)
        print(prompt["category"], {n: f"{row[n][0].tokens_per_s * row['plain_step_s']:.2f}x" for n in pipes}, flush=True)
    for name in pipes:
        report(name, rows)


def report(name: str, rows: list[dict]) -> None:
    speedups = [r[name][0].tokens_per_s * r["plain_step_s"] for r in rows]
    taus = [r[name][0].mean_accepted_length for r in rows]
    print(f"{name}: speedup median {statistics.median(speedups):.3f} mean {statistics.mean(speedups):.3f}, "
          f"τ {statistics.mean(taus):.2f}, exact {sum(r[name][1] for r in rows)}/{len(rows)}")
    per_category = defaultdict(list)
    cost = defaultdict(list)  # γ -> step seconds / plain step seconds
    source = defaultdict(list)  # 'L' / 'H' -> (γ, emitted)
    for r, s in zip(rows, speedups):
        per_category[r["category"]].append(s)
        stats, _, tags = r[name]
        drafted = iter(tags)  # one tag per step that asked the proposer (γ > 0)
        for gamma, emitted, seconds in zip(stats.gamma_trace, stats.emitted_trace, stats.step_s):
            cost[gamma].append(seconds / r["plain_step_s"])
            if tags and gamma:
                source[next(drafted, "?")].append((gamma, emitted))
    print("  by category:", {c: round(statistics.mean(v), 2) for c, v in per_category.items()})
    print("  step cost in plain steps by γ:", {g: round(statistics.median(v), 2) for g, v in sorted(cost.items())})
    for tag, steps in sorted(source.items()):
        print(f"  {'lookup' if tag == 'L' else 'head'} steps: {len(steps)}, mean γ "
              f"{statistics.mean(g for g, _ in steps):.2f}, mean emitted {statistics.mean(e for _, e in steps):.2f}")


if __name__ == "__main__":
    main()
