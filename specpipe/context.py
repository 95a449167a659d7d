"""What one sequence may hold, and the check every decode path makes before its first forward.

A prompt that leaves no room for output is refused (a SpecpipeError naming it, its token count
and the bound); one whose max_new_tokens would overflow is capped to what fits, with a
`ContextWarning` that says so (vLLM's offline rule). The bound is the tightest of the target's
and a draft model's: the native engine's preallocated KV cache (`cache_len`), else the model's
`max_position_embeddings`. A pipeline's `Budget` applies it (the decode loop asks it per
request, bench for a whole prompt set before anything is measured).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from specpipe.drafts import DraftBatch
from specpipe.errors import SpecpipeError


class ContextWarning(UserWarning):
    """A generation's max_new_tokens was lowered to what the context holds (`Budget.fit`)."""


@dataclass(frozen=True)
class ContextLimit:
    tokens: int  # prompt + output tokens one sequence may hold
    what: str  # what sets that number, for messages
    fix: str = ""  # how to raise it ("": the model itself is the bound)


@dataclass
class Budget:
    """The context rule of one pipeline: what a row may hold on the target's runner and a draft
    model's (which keeps its own cache, one token shorter than the target's: the target's bound
    is the same or looser). chat: prompts go through the chat template (messages say so)."""

    target: object  # the target's runner
    drafter: object | None = None  # a draft model's runner (the draft and twin proposers)
    chat: bool = False
    announced: set[tuple[int, ...]] = field(default_factory=set)  # prompts whose fit was reported
    _limit: tuple[ContextLimit | None] | None = field(default=None, init=False, repr=False)  # (the limit,) once read

    def limit(self) -> ContextLimit | None:
        """The tightest bound of the target's runner and the drafter's (read once: a runner's
        capacity is fixed when it is built, and the step asks every time)."""
        if self._limit is None:
            limits = [context_limit(self.target, "target"),
                      context_limit(self.drafter, "draft") if self.drafter else None]
            self._limit = (min((limit for limit in limits if limit is not None), key=lambda limit: limit.tokens,
                               default=None),)
        return self._limit[0]

    def room(self, ids: list[int]) -> int | None:
        """New tokens that fit after `ids` (None: no known bound). The cache holds every committed
        token but the last, so n new tokens need len(ids) + n - 1 slots."""
        limit = self.limit()
        return None if limit is None else limit.tokens - len(ids) + 1

    def fit(self, ids: list[int], max_new_tokens: int, name: str = "The prompt") -> int:
        """max_new_tokens, lowered (with a ContextWarning) where prompt + output would overflow the
        context; a SpecpipeError where the prompt leaves no room at all. The decode loop calls it
        per request before its first forward."""
        if not ids:
            raise SpecpipeError(f"{name} is empty: it encodes to no tokens. Give it some text.")
        room, limit = self.room(ids), self.limit()
        tokens = f"{len(ids)} tokens" + (" (after the chat template)" if self.chat else "")
        fix = f"{' or ' + limit.fix if limit is not None and limit.fix else ''}"
        if room is not None and room < 1:
            raise SpecpipeError(f"{name} is {tokens}, but {limit.what}: no room is left for output. Shorten the "
                                f"prompt{fix}.")
        if room is not None and max_new_tokens > room and tuple(ids) not in self.announced:
            self.announced.add(tuple(ids))
            warnings.warn(ContextWarning(
                f"{name} is {tokens} and max_new_tokens={max_new_tokens}, but {limit.what}: generating at most "
                f"{room} new tokens. Lower max_new_tokens, shorten the prompt{fix} to keep them all."), stacklevel=2)
        return max_new_tokens if room is None else min(max_new_tokens, room)

    def fit_all(self, named: list[tuple[str, list[int], int]]) -> list[int]:
        """`fit` of several (name, ids, max_new_tokens), before any is decoded: every prompt that
        does not fit is named in one SpecpipeError; later runs of these prompts do not warn again."""
        rooms = [self.room(ids) for _, ids, _ in named]
        too_long = [f"{name} ({len(ids)} tokens)" for (name, ids, _), room in zip(named, rooms)
                    if room is not None and room < 1]
        if too_long:
            limit = self.limit()
            raise SpecpipeError(f"{len(too_long)} of {len(named)} prompts leave no room for output, as "
                                f"{limit.what}: {', '.join(too_long)}. Shorten or drop them"
                                f"{' or ' + limit.fix if limit.fix else ''}.")
        fitted = [self.fit(ids, tokens, name) for name, ids, tokens in named]
        self.announced.update(tuple(ids) for _, ids, _ in named)
        return fitted


def check_fits(pipeline, prompts: list[dict], max_new_tokens: int) -> list[int]:
    """Bench's check before anything is measured: every prompt of a set (`load_prompts` records,
    with bench's rule that a prompt may ask for fewer tokens) fits the context, or all that do not
    are named by id; prompts whose output will be cut short are warned of by id. Their budgets."""
    return pipeline.budget.fit_all([(f"Prompt '{p['id']}'", pipeline.encode(p["messages"]),
                                     min(int(p.get("max_new_tokens") or max_new_tokens), max_new_tokens))
                                    for p in prompts])


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


def trimmed(draft: DraftBatch, rooms: list[int | None]) -> DraftBatch:
    """A tree batch cut to the room its rows have left (`Budget.room` of each busy row; None: no
    known bound): one verify block is as wide for every row, so the fullest row's room bounds
    them all, and every row keeps its first nodes that fit beside its last token (parents come
    before their children, so a prefix is a tree); only steps just before the context fills lose
    any. The depths are recomputed where the parents are: nothing is read back."""
    known = [room for room in rooms if room is not None]
    if draft.tree is None or not known:
        return draft
    return draft.cut(max(min(known) - 1, 0))
