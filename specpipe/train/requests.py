"""Written requests for self-distillation (`instructions=requests`): the banks
`prompts/requests.jsonl`, then `prompts/requests-2.jsonl` to `requests-6.jsonl` (banks 5 and 6 lean to
code and code edits, 70 each of their 280, where the Qwen head trailed the draft model).

The templates of train/prompts.py vary a few hundred phrasings; heads trained on the answers
to them draft far better on held-out answers to the same templates than on the users' own
requests (Qwen2.5-Coder-1.5B: held-out τ 2.04, dev prompts 1.47; docs/training.md), and the target's
self-written requests did not close that gap for Qwen (train/self_instruct.py). These are
requests as users write them, in the five kinds of the dev set (code, code edits, chat,
summaries, math): each names its task, its constraints and its material (the code to edit,
the passage to summarize), written for specpipe and disjoint from the dev prompts (no task,
name, passage or problem of theirs). Each bank is taken a kind at a time in turn, so any first
`count` is balanced; past the last bank, the templates follow. A new bank goes after the others,
so the sequence only grows: the answers and features cached for a shorter one stay valid (the
answers' cache checks each request's text, train/distill.py).
"""

from __future__ import annotations

from itertools import zip_longest

from specpipe.prompts import load_prompts
from specpipe.train import prompts

BANKS = ("requests", "requests-2", "requests-3", "requests-4", "requests-5", "requests-6")  # prompt sets of specpipe/prompts, in the order they are taken


def instructions(count: int, seed: int = 0) -> list[str]:
    """The first `count`: each bank's requests, the kinds in turn, then the seed's templates."""
    written = [r for bank in BANKS for r in _in_turn(bank)]
    return written[:count] + (prompts.instructions(count - len(written), seed) if count > len(written) else [])


def _in_turn(bank: str) -> list[str]:
    """A bank's requests, one of each kind in turn (a kind that runs out drops from the turn)."""
    by_kind: dict[str, list[str]] = {}
    for p in load_prompts(bank):
        by_kind.setdefault(p["category"], []).append(p["messages"][-1]["content"])
    return [r for turn in zip_longest(*by_kind.values()) for r in turn if r is not None]
