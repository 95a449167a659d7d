"""`Pipeline`: a target, a proposer, a verifier and a γ controller, decoding as one loop.

The plain baseline is the same loop with no proposer (γ = 0), so the speedup compares two
runs of the same code. `generate` streams a `StepEvent` per step; `run` returns a `Generation`.
Building from a config lives in `build.py`; this module only decodes.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch

from specpipe.context import ContextLimit, ContextWarning, context_limit, trimmed
from specpipe.controllers.base import Controller
from specpipe.engine import Runner, make_runner
from specpipe.errors import SpecpipeError
from specpipe.metrics import Stats
from specpipe.models.loader import LoadedModel
from specpipe.proposers.base import Proposer
from specpipe.sampling import SamplingParams
from specpipe.state import DecodeState
from specpipe.stopping import StopRule, eos_ids_of
from specpipe.types import DraftBlock, DraftTree, StepTiming, Verdict
from specpipe.verifiers.base import Verifier


@dataclass
class StepEvent:
    tokens: list[int]  # emitted by this step (after the stop rule)
    text: str  # text added by this step
    gamma: int  # γ of this step
    stats: Stats  # running totals
    finish_reason: str | None = None  # set on the last event: eos, stop_string or length


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: Stats


class Pipeline:
    def __init__(
        self,
        target: LoadedModel,
        proposer: Proposer | None,
        verifier: Verifier,
        controller: Controller | None,
        sampling: SamplingParams = SamplingParams(),
        chat: bool | None = None,
        runner: Runner | None = None,
        engine: str = "auto",
    ):
        """runner: the target's (built from `target.model` on `engine` at its own precision if None)."""
        self.target = target
        self.proposer = proposer
        self.verifier = verifier
        self.controller = controller
        self.sampling = sampling
        self.chat = bool(target.tokenizer.chat_template) if chat is None else chat
        self.runner = runner if runner is not None else make_runner(target.model, engine=engine)
        if proposer is not None:
            proposer.bind(self.runner)
            if not verifier.verifies_trees:
                proposer.chains_only()  # heads read the target's LM head and embeddings through it
        self.hidden = tuple(proposer.hidden_layers) if proposer is not None else ()
        self.eos_ids = eos_ids_of(target.model, target.tokenizer)
        self.warnings: list = []  # compatibility warnings from the build (checks.Check)
        self.batch_parts: dict = {}  # batched runners and proposers by slot count (specpipe/batch.py)
        self.announced: set[tuple[int, ...]] = set()  # prompts whose fit was reported: not again per run

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: the target's weights and KV cache, then the proposer's parts."""
        target = self.runner.memory()
        parts = {"target weights": target.weights, "target KV cache": target.cache}
        return {**parts, **(self.proposer.memory() if self.proposer is not None else {})}

    @classmethod
    def from_config(cls, cfg) -> "Pipeline":
        from specpipe.build import build_pipeline

        return build_pipeline(cfg)

    def encode(self, prompt: str | list[dict]) -> list[int]:
        """Prompt text (or chat messages) -> token ids, through the chat template when on."""
        return encode(self.target.tokenizer, prompt, self.chat)

    def generate(
        self,
        prompt: str | list[dict] | list[int],
        *,
        max_new_tokens: int = 128,
        seed: int = 0,
        stop: list[str] = (),
        speculative: bool = True,
    ) -> Iterator[StepEvent]:
        """Stream one generation; `speculative=False` decodes with the plain target."""
        ids = prompt if is_ids(prompt) else self.encode(prompt)
        max_new_tokens = self.fit(ids, max_new_tokens)  # refuse or cap now, not at a full cache mid-way
        state = DecodeState(self.runner, ids, torch.Generator().manual_seed(seed))
        proposer = self.proposer if speculative else None
        if proposer is not None:
            state.early_stop = self.controller.early_stop
        rule = StopRule(self.target.tokenizer, self.eos_ids, list(stop), max_new_tokens)
        stats = Stats()
        started = time.perf_counter()
        hidden = self.hidden if proposer is not None else ()
        out = state.prefill(hidden)
        if proposer is not None:
            proposer.prefill(state, out)
        stats.prefill_s = time.perf_counter() - started
        out: list[int] = []
        text = TextStream(self.target.tokenizer)
        while True:
            verdict, timing = self.step(state, proposer, max_new_tokens - len(out))
            keep, reason = rule.cut(out, verdict.emitted)
            out.extend(verdict.emitted[:keep])
            stats.record(verdict, timing, keep)
            delta = text.push(verdict.emitted[:keep], final=reason is not None)
            yield StepEvent(verdict.emitted[:keep], delta, verdict.gamma, stats, reason)
            if reason is not None:
                return

    def step(self, state: DecodeState, proposer: Proposer | None, budget: int) -> tuple[Verdict, StepTiming]:
        """One speculative step (DESIGN.md, "One step"); γ = 0 is a plain decoding step."""
        t0 = time.perf_counter()
        gamma = min(self.controller.gamma(), budget - 1) if proposer else 0  # 1. a step emits ≤ γ+1
        draft = proposer.propose(state, gamma) if gamma > 0 else DraftBlock.empty()  # 2.
        if isinstance(draft, DraftTree):  # a chain fits (γ < budget); a tree has more nodes than γ
            draft = trimmed(draft, self.room(state.tokens))
        t1 = time.perf_counter()
        out = state.target.forward([state.tokens[-1], *draft.tokens.tolist()], ancestry=draft.ancestry(),
                                   hidden=self.hidden if proposer else ())  # 3.
        verdict = self.verifier.verify(draft, out.logits[0], state.rng)  # 4.
        t2 = time.perf_counter()
        state.commit(verdict)  # 5. roll the target cache back to the accepted prefix
        if proposer is not None:
            proposer.commit(verdict, out)  # also after γ = 0: feature-based proposers read this step
        timing = StepTiming(t1 - t0, t2 - t1)
        if proposer is not None:
            self.controller.update(verdict, timing)  # 6.
        return verdict, timing

    def context_limit(self) -> ContextLimit | None:
        """The tightest bound of the target's runner and a draft model's (which keeps its own cache,
        one token shorter than the target's: the target's bound is the same or looser)."""
        drafter = getattr(self.proposer, "runner", None)  # ModelDrafter: the draft and twin proposers
        limits = [context_limit(self.runner, "target"), context_limit(drafter, "draft") if drafter else None]
        return min((limit for limit in limits if limit is not None), key=lambda limit: limit.tokens, default=None)

    def room(self, ids: list[int]) -> int | None:
        """New tokens that fit after `ids` (None: no known bound). The cache holds every committed
        token but the last, so n new tokens need len(ids) + n - 1 slots."""
        limit = self.context_limit()
        return None if limit is None else limit.tokens - len(ids) + 1

    def fit(self, ids: list[int], max_new_tokens: int, name: str = "The prompt") -> int:
        """max_new_tokens, lowered (with a ContextWarning) where prompt + output would overflow the
        context; a SpecpipeError where the prompt leaves no room at all. Every decode path calls
        it before its first forward: `generate`, and `batch.BatchDecoder` per request."""
        if not ids:
            raise SpecpipeError(f"{name} is empty: it encodes to no tokens. Give it some text.")
        room, limit = self.room(ids), self.context_limit()
        tokens = f"{len(ids)} tokens" + (" (after the chat template)" if self.chat else "")
        if room is not None and room < 1:
            raise SpecpipeError(f"{name} is {tokens}, but {limit.what}: no room is left for output. Shorten the "
                                f"prompt{' or ' + limit.fix if limit.fix else ''}.")
        if room is not None and max_new_tokens > room and tuple(ids) not in self.announced:
            self.announced.add(tuple(ids))
            warnings.warn(ContextWarning(
                f"{name} is {tokens} and max_new_tokens={max_new_tokens}, but {limit.what}: generating at most "
                f"{room} new tokens. Lower max_new_tokens, shorten the prompt{' or ' + limit.fix if limit.fix else ''}"
                " to keep them all."), stacklevel=2)
        return max_new_tokens if room is None else min(max_new_tokens, room)

    def fit_all(self, named: list[tuple[str, list[int], int]]) -> list[int]:
        """`fit` of several (name, ids, max_new_tokens), before any is decoded: every prompt that
        does not fit is named in one SpecpipeError; later runs of these prompts do not warn again."""
        rooms = [self.room(ids) for _, ids, _ in named]
        too_long = [f"{name} ({len(ids)} tokens)" for (name, ids, _), room in zip(named, rooms) if room is not None
                    and room < 1]
        if too_long:
            limit = self.context_limit()
            raise SpecpipeError(f"{len(too_long)} of {len(named)} prompts leave no room for output, as "
                                f"{limit.what}: {', '.join(too_long)}. Shorten or drop them"
                                f"{' or ' + limit.fix if limit.fix else ''}.")
        fitted = [self.fit(ids, tokens, name) for name, ids, tokens in named]
        self.announced.update(tuple(ids) for _, ids, _ in named)
        return fitted

    def run(self, prompt, **kwargs) -> Generation:
        """Decode to the end; return the whole generation."""
        tokens: list[int] = []
        text = ""
        for event in self.generate(prompt, **kwargs):
            tokens.extend(event.tokens)
            text += event.text
        return Generation(tokens, text, event.finish_reason, event.stats)

    def batch_refusal(self, proposer: Proposer | None = None) -> str | None:
        """Why this pipeline decodes a batch one sequence at a time, or None (it batches)."""
        if not hasattr(self.runner, "batched"):
            return f"the target runs on the {self.runner.engine} engine, which has no batch rows (engine=native has)"
        return proposer.batch_refusal if proposer is not None else None

    def serve(self, requests, *, concurrency: int = 8, speculative: bool = True):
        """Stream a sequence of `batch.Request`s through continuous batching, `concurrency` at a
        time: `batch.RequestEvent`s of every request, in step order (see specpipe/batch.py)."""
        from specpipe.batch import BatchDecoder

        return BatchDecoder(self, concurrency, speculative).run(requests)

    def generate_batch(self, prompts: list, *, max_new_tokens: int = 128, seed: int = 0, stop: list[str] = (),
                       speculative: bool = True, concurrency: int | None = None) -> list[Generation]:
        """Decode several prompts together (all at once unless `concurrency` is smaller); each is
        seeded with `seed`, so each row is what `run(prompt, seed=seed)` returns."""
        from specpipe.batch import Request

        requests = [Request(p, max_new_tokens, seed, tuple(stop)) for p in prompts]
        tokens: list[list[int]] = [[] for _ in prompts]
        texts = [""] * len(prompts)
        done: dict[int, Generation] = {}
        for event in self.serve(requests, concurrency=concurrency or len(prompts), speculative=speculative):
            tokens[event.index].extend(event.tokens)
            texts[event.index] += event.text
            if event.finish_reason is not None:
                done[event.index] = Generation(tokens[event.index], texts[event.index], event.finish_reason,
                                               event.stats)
        return [done[i] for i in range(len(prompts))]


def encode(tok, prompt: str | list[dict], chat: bool) -> list[int]:
    """Prompt text (or chat messages) -> token ids, through the chat template when `chat`."""
    if chat:
        from jinja2 import TemplateError, TemplateSyntaxError

        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateSyntaxError as err:
            raise SpecpipeError(f"The model's chat template cannot be read ({err}). Fix its chat_template (in "
                                "tokenizer_config.json), or pass model.chat=false.") from None
        except TemplateError as err:  # e.g. a role the template does not know, or turns out of order
            raise SpecpipeError(f"The model's chat template refused the prompt's messages ({err}). Use the roles and "
                                "turn order it expects (system, user, assistant), or pass model.chat=false.") from None
        return tok(text, add_special_tokens=False)["input_ids"]
    text = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)
    return tok(text)["input_ids"]


def is_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], int)


class TextStream:
    """Incremental detokenization: each step decodes a short window of recent tokens, not the
    whole output (which made the text of a long generation cost O(n²)). The window starts at
    the previous step's tokens, so the new ones are decoded in context (a leading space or a
    byte sequence split across steps), and a trailing partial UTF-8 character is held back
    until it completes (vLLM's and TGI's prefix/read offsets)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: tokens before it are already text
        self.read = 0  # tokens whose text has been emitted

    def push(self, new: list[int], final: bool = False) -> str:
        self.ids.extend(new)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        done = decode(self.ids[self.prefix : self.read])
        text = decode(self.ids[self.prefix :])
        if not final and text.endswith("\ufffd"):
            return ""  # a multi-byte character is still incomplete
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(done) :]
