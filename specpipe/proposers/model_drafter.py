"""`ModelDrafter`: drafts γ tokens autoregressively from a (smaller or quantized) causal LM.

Shared by the `draft` proposer (an independent model) and the `twin` proposer (the target's own
weights at a cheaper precision). The drafter keeps its own KV cache; after each verdict it is
cropped to the longest prefix it shares with the committed tokens, and the next `propose`
feeds whatever committed tokens it lacks (the last token, plus the last draft token when all
γ were accepted) in one forward.
"""

from __future__ import annotations

import torch

from specpipe.engine import make_runner
from specpipe.proposers.base import Proposer
from specpipe.sampling import SamplingParams, sample
from specpipe.state import DecodeState
from specpipe.types import DraftBlock, Verdict


class ModelDrafter(Proposer):
    def __init__(self, model: torch.nn.Module, sampling: SamplingParams, *, engine: str = "auto",
                 precision: str = "none", cache_len: int | None = None, device: str = "cpu"):
        """model: the draft's weights (the hf engine quantizes them in place to `precision`)."""
        self.runner = make_runner(model, engine=engine, precision=precision, cache_len=cache_len, device=device)
        self.sampling = sampling
        self._base = 0  # committed length when the last draft was proposed

    @classmethod
    def on(cls, context, model: torch.nn.Module, precision: str) -> "ModelDrafter":
        """A drafter on the pipeline's engine, device and cache length (a build context's)."""
        return cls(model, context.sampling, engine=context.engine, precision=precision,
                   cache_len=context.cache_len, device=context.device)

    def prefill(self, state: DecodeState, out=None) -> None:
        self.runner.reset()
        if state.prompt_len > 1:
            self.runner.forward(state.tokens[:-1], last_only=True)

    def propose(self, state: DecodeState, gamma: int) -> DraftBlock:
        self._base = len(state.tokens)
        feed = state.tokens[self.runner.length :]  # committed tokens the draft cache lacks
        tokens, probs, confidence = [], [], []
        for i in range(gamma):
            logits = self.runner.forward(feed, last_only=True).logits[0, -1]  # [V]
            if self.sampling.greedy:
                token = int(logits.argmax())
                top = float(torch.softmax(logits.float(), -1)[token])
            else:
                p = self.sampling.probs(logits)  # [V] float32, same transform as the target
                token = int(sample(p, state.rng))
                probs.append(p)
                top = float(p.max())
            tokens.append(token)
            confidence.append(top)
            feed = [token]
            if state.early_stop is not None and state.early_stop(i, top):
                break  # the controller's call: γ logic stays out of the proposer
        return DraftBlock(
            torch.tensor(tokens, dtype=torch.long),
            torch.stack(probs) if probs else None,
            torch.tensor(confidence),
        )

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}

    def commit(self, verdict: Verdict, out=None) -> None:
        if verdict.gamma == 0:
            return  # nothing was drafted: the cache is as the last propose left it
        # the cache holds committed[:base] + draft[:γ-1]; draft[:n] survived the verdict
        self.runner.crop(self._base + min(verdict.n_accepted, max(verdict.gamma - 1, 0)))
