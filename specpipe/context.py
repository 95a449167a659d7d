"""What one sequence may hold, and the check every decode path makes before its first forward.

A prompt that leaves no room for output is refused (a SpecpipeError naming it, its token count
and the bound); one whose max_new_tokens would overflow is capped to what fits, with a
`ContextWarning` that says so (vLLM's offline rule). The bound is the tightest of the target's
and a draft model's: the native engine's preallocated KV cache (`cache_len`), else the model's
`max_position_embeddings`. `Pipeline.fit` / `fit_all` apply it; this module holds the parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpipe.drafts import DraftBatch, depths_of


class ContextWarning(UserWarning):
    """A generation's max_new_tokens was lowered to what the context holds (`Pipeline.fit`)."""


@dataclass(frozen=True)
class ContextLimit:
    tokens: int  # prompt + output tokens one sequence may hold
    what: str  # what sets that number, for messages
    fix: str = ""  # how to raise it ("": the model itself is the bound)


def check_fits(pipeline, prompts: list[dict], max_new_tokens: int) -> list[int]:
    """Bench's check before anything is measured: every prompt of a set (`load_prompts` records,
    with bench's rule that a prompt may ask for fewer tokens) fits the context, or all that do not
    are named by id; prompts whose output will be cut short are warned of by id. Their budgets."""
    return pipeline.fit_all([(f"Prompt '{p['id']}'", pipeline.encode(p["messages"]),
                              min(int(p.get("max_new_tokens") or max_new_tokens), max_new_tokens)) for p in prompts])


def context_limit(runner, part: str) -> ContextLimit | None:
    """What one sequence may hold on `runner`: the native engine's preallocated KV cache (cache_len,
    itself at most the model's max_position_embeddings), else max_position_embeddings (the hf
    engine's cache grows, but positions past the model's are garbage, or an index error); None
    where neither is known."""
    positions = getattr(runner, "positions", None)  # a GGUF runner knows its model's trained context
    if positions is None:
        positions = getattr(getattr(getattr(runner, "model", None), "config", None), "max_position_embeddings", None)
    positions = positions if isinstance(positions, int) and positions > 0 else None
    slots = getattr(runner, "capacity", None) or getattr(getattr(runner, "cache", None), "capacity", None)
    if isinstance(slots, int) and (positions is None or slots < positions):
        most = f" (the {part} model takes up to {positions})" if positions else ""
        return ContextLimit(slots, f"the {part}'s KV cache holds {slots} tokens (cache_len={slots})",
                            f"pass a larger cache_len={most}")
    if positions is not None:
        return ContextLimit(positions, f"the {part} model's context is {positions} tokens (max_position_embeddings)")
    return None


def trimmed(draft: DraftBatch, room: int | None) -> DraftBatch:
    """A one-row tree draft's first nodes, as many as fit beside the last token in the `room` left
    (parents come before their children, so a prefix is a tree); only steps just before the
    context fills lose any. Host work: the tree's parents are host ints."""
    size = len(draft.tree) if room is None else room - 1
    if len(draft.tree) <= size:
        return draft
    parents = draft.tree[:size]
    depth = torch.full((1,), max(depths_of(parents)), dtype=torch.long).to(draft.tokens.device, non_blocking=True)
    confidence = draft.confidence[:, :size] if draft.confidence is not None else None
    return DraftBatch(draft.tokens[:, :size], depth, draft.gammas, None, confidence, parents)
