"""Written requests for self-distillation (`instructions=requests`): `prompts/requests.jsonl`.

The templates of train/prompts.py vary a few hundred phrasings; heads trained on the answers
to them draft far better on held-out answers to the same templates than on the users' own
requests (Qwen2.5-Coder-1.5B, session 13: held-out τ 2.04, dev prompts 1.47), and the target's
self-written requests did not close that gap for Qwen (train/self_instruct.py). These are
requests as users write them, in the five kinds of the dev set (code, code edits, chat,
summaries, math): each names its task, its constraints and its material (the code to edit,
the passage to summarize), written for specpipe and disjoint from the dev prompts (no task,
name, passage or problem of theirs). They are taken a kind at a time in turn, so any first
`count` is balanced; past the file, the templates follow.
"""

from __future__ import annotations

import hashlib
from itertools import zip_longest

from specpipe.prompts import BUILTIN, load_prompts
from specpipe.train import prompts

NAME = "requests"


def instructions(count: int, seed: int = 0) -> list[str]:
    """The first `count`: the written requests, the kinds in turn, then the seed's templates."""
    by_kind: dict[str, list[str]] = {}
    for p in load_prompts(NAME):
        by_kind.setdefault(p["category"], []).append(p["messages"][-1]["content"])
    written = [r for turn in zip_longest(*by_kind.values()) for r in turn if r is not None]
    return written[:count] + (prompts.instructions(count - len(written), seed) if count > len(written) else [])


def digest() -> str:
    """The file's content hash: cache keys carry it, so an edited file gets answers of its own."""
    return hashlib.sha256(BUILTIN[NAME].read_bytes()).hexdigest()[:12]
