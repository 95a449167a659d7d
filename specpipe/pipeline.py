"""`Pipeline`: a target, a proposer, a verifier and a γ controller, decoding as one loop.

The plain baseline is the same loop with no proposer (γ = 0), so the speedup compares two
runs of the same code. `generate` streams a `StepEvent` per step; `run` returns a `Generation`.
Building from a config lives in `build.py`; this module only decodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import torch

from specpipe.controllers.base import Controller
from specpipe.engine import Runner, make_runner
from specpipe.metrics import Stats
from specpipe.models.loader import LoadedModel
from specpipe.proposers.base import Proposer
from specpipe.sampling import SamplingParams
from specpipe.state import DecodeState
from specpipe.stopping import StopRule, eos_ids_of
from specpipe.types import DraftBlock, StepTiming, Verdict
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
            proposer.bind(self.runner)  # heads read the target's LM head and embeddings through it
        self.hidden = tuple(proposer.hidden_layers) if proposer is not None else ()
        self.eos_ids = eos_ids_of(target.model, target.tokenizer)
        self.warnings: list = []  # compatibility warnings from the build (checks.Check)
        self.batch_parts: dict = {}  # batched runners and proposers by slot count (specpipe/batch.py)

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
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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
