"""`Pipeline`: a target, a proposer, a verifier and a γ controller, decoding as one loop.

Every entry point drives the same batch-first loop (specpipe/decode/loop.py, around the step
of specpipe/decode/step.py): `generate` and `run` decode one request as a batch of one, `serve`
and `generate_batch` several at a time. The plain baseline is the same loop with no proposer
(γ = 0), so the speedup compares two runs of the same code. A thin facade: the step's parts are
one typed value (`parts()`, decode/parts.py) and the context rule is the `Budget`'s
(context.py). Building from a config lives in `build.py`; this module only decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from specpipe.context import Budget, ContextLimit
from specpipe.controllers.base import Controller
from specpipe.decode.loop import Decoder, Request, RequestEvent
from specpipe.decode.parts import Parts, batch_refusal
from specpipe.decode.text import TextStream, encode, is_ids
from specpipe.engine import Runner, make_runner
from specpipe.errors import SpecpipeError
from specpipe.metrics import Stats
from specpipe.models.loader import LoadedModel
from specpipe.proposers.base import Proposer
from specpipe.sampling import SamplingParams
from specpipe.stopping import eos_ids_of
from specpipe.verifiers.base import Verifier

__all__ = ["Generation", "Pipeline", "Request", "StepEvent", "TextStream", "encode", "is_ids"]


@dataclass
class StepEvent:
    tokens: list[int]  # emitted by this step (after the stop rule)
    text: str  # text added by this step
    gamma: int  # γ of this step
    stats: Stats  # running totals
    finish_reason: str | None = None  # set on the last event: eos, stop_string or length
    held: bool = False  # the guard held this step at γ = 0 (speculation paused, or a plain probe)


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
        warnings: list | tuple = (),
        overlap: str = "auto",
    ):
        """runner: the target's (built from `target.model` on `engine` at its own precision if None);
        warnings: the build's compatibility warnings (`checks.Check`), for the CLI to show; overlap:
        whether plain decoding queues a step before reading the last (decode/loop.py; auto: on CUDA)."""
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
        self.runner.plan(self.widest_block())
        self.eos_ids = eos_ids_of(self.runner, target.tokenizer)
        self.warnings = list(warnings)
        self.overlap = overlap
        self.budget = Budget(self.runner, getattr(proposer, "runner", None), self.chat)  # a draft model's own cache

    def parts(self, speculative: bool = True) -> Parts:
        """The step's parts (plain decoding: no proposer, no controller)."""
        proposer = self.proposer if speculative else None
        return Parts(self.runner, proposer, self.verifier, self.controller if proposer is not None else None,
                     self.budget, self.target.tokenizer, self.eos_ids, self.encode,
                     self.hidden if proposer is not None else (), self.overlap)

    def widest_block(self) -> int:
        """The most tokens a row of one target forward takes: the last token and the widest draft
        (the controller's largest γ; a tree proposer's largest tree where the runner takes trees).
        Plain decoding through this pipeline plans the same block, so with `kernels=exact` its
        steps run in the shape of its verify blocks (engine/static.py)."""
        if self.proposer is None or self.controller is None:
            return 1
        trees = self.verifier.verifies_trees and self.runner.trees
        return 1 + self.proposer.widest(self.controller.widest(), trees)

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: the target's weights and KV cache, then the proposer's parts."""
        return self.parts().memory()

    @classmethod
    def from_config(cls, cfg, settings=None) -> "Pipeline":
        """The pipeline a composed config describes (`specpipe.compose([...])` or a CLI config);
        settings: its `specpipe.settings.Settings`, where the caller resolved them already (the
        commands do, once, for the checks and the build alike)."""
        from specpipe.build import build_parts  # below the pipeline; here, so importing this module stays light

        return cls(**build_parts(cfg, settings))

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
        """Stream one generation (a batch of one); `speculative=False` decodes with the plain target.
        seed: the request's own (a batch of one has no rows to share a stream with, and it costs
        no launch more), so it samples what `Request(prompt, seed=seed)` samples in any batch."""
        request = Request(prompt, max_new_tokens, seed, tuple(stop))
        for event in Decoder(self, 1, speculative).run([request]):
            yield StepEvent(event.tokens, event.text, event.gamma, event.stats, event.finish_reason, event.held)

    def context_limit(self) -> ContextLimit | None:
        return self.budget.limit()

    def room(self, ids: list[int]) -> int | None:
        return self.budget.room(ids)

    def fit(self, ids: list[int], max_new_tokens: int, name: str = "The prompt") -> int:
        return self.budget.fit(ids, max_new_tokens, name)

    def fit_all(self, named: list[tuple[str, list[int], int]]) -> list[int]:
        return self.budget.fit_all(named)

    def run(self, prompt, **kwargs) -> Generation:
        """Decode to the end; return the whole generation."""
        return collect(self.generate(prompt, **kwargs))

    def batch_refusal(self, proposer: Proposer | None = None) -> str | None:
        """Why this pipeline decodes a batch one sequence at a time, or None (it batches)."""
        return batch_refusal(self.runner, proposer)

    def serve(self, requests, *, concurrency: int = 8, speculative: bool = True,
              seed: int = 0) -> Iterator[RequestEvent]:
        """Stream a sequence of `Request`s through continuous batching, `concurrency` at a time:
        the `RequestEvent`s of every request, in step order (specpipe/decode/loop.py). seed: the
        run's stream, shared by the requests without a seed of their own (`Request.seed`)."""
        return Decoder(self, concurrency, speculative, seed).run(requests)

    def generate_batch(self, prompts: list, *, max_new_tokens: int = 128, seed: int = 0, stop: list[str] = (),
                       speculative: bool | list[bool] = True, concurrency: int | None = None,
                       seeds: list[int | None] | None = None) -> list[Generation]:
        """Decode several prompts together (all at once unless `concurrency` is smaller). seed: the
        run's, for the stream the prompts share (one draw launch per purpose for the batch, as
        vLLM's; a row's samples then depend on its neighbours); seeds: one per prompt, where a
        prompt needs samples of its own (None: the shared stream): a prompt seeded s is what
        `run(prompt, seed=s)` returns. `speculative` may be one flag per prompt: those set False
        decode plainly beside the others."""
        flags = speculative if isinstance(speculative, list) else [True] * len(prompts)
        seeds = seeds if seeds is not None else [None] * len(prompts)
        if len(seeds) != len(prompts):
            raise SpecpipeError(f"generate_batch got {len(prompts)} prompts and {len(seeds)} seeds: give one seed per "
                                "prompt (None where a prompt shares the batch's stream), or no seeds at all.")
        requests = [Request(p, max_new_tokens, own, tuple(stop), flag) for p, own, flag in zip(prompts, seeds, flags)]
        events = self.serve(requests, concurrency=concurrency or len(prompts), speculative=speculative is not False,
                            seed=seed)
        by_request: dict[int, list] = {i: [] for i in range(len(prompts))}
        for event in events:
            by_request[event.index].append(event)
        return [collect(by_request[i]) for i in range(len(prompts))]


def collect(events) -> Generation:
    """The events of one generation (StepEvents or one request's RequestEvents) as a Generation."""
    tokens: list[int] = []
    text = ""
    event = None
    for event in events:
        tokens.extend(event.tokens)
        text += event.text
    return Generation(tokens, text, event.finish_reason, event.stats)
