"""`ModelDrafter`: drafts γ tokens autoregressively from a (smaller or quantized) causal LM.

Shared by the `draft` proposer (an independent model) and the `twin` proposer (the target's own
weights at a cheaper precision). The drafter keeps its own KV cache; after each verdict it is
cropped to the longest prefix it shares with the committed tokens, and the next `propose`
feeds whatever committed tokens it lacks (the last token, plus the last draft token when all
γ were accepted) in one forward.
"""

from __future__ import annotations

import torch

from specpipe.engine import TargetOutput, make_runner
from specpipe.proposers.base import BatchProposer, Proposer
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

    @property
    def batch_refusal(self) -> str | None:
        if not hasattr(self.runner, "batched"):
            return f"the draft runs on the {self.runner.engine} engine, which decodes one sequence at a time"
        return None

    def batched(self, slots: int) -> "BatchDrafter":
        return BatchDrafter(self, slots)

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}

    def commit(self, verdict: Verdict, out=None) -> None:
        if verdict.gamma == 0:
            return  # nothing was drafted: the cache is as the last propose left it
        # the cache holds committed[:base] + draft[:γ-1]; draft[:n] survived the verdict
        self.runner.crop(self._base + min(verdict.n_accepted, max(verdict.gamma - 1, 0)))


class BatchDrafter(BatchProposer):
    """A draft model over a batch: each draft step is one forward of every row (a row whose
    draft is done feeds a pad token, cropped again). Rows lag the committed tokens by one or
    two (the bonus after a fully accepted draft), so the first forward of a step is ragged:
    right-padded, each row's logits read at its own last fed token."""

    def __init__(self, drafter: ModelDrafter, slots: int):
        self.sampling = drafter.sampling
        self.runner = drafter.runner.batched(slots)  # the drafter's weights, a cache of `slots` rows
        self.base = [0] * slots  # per slot: committed length when its last draft was proposed

    def reset(self) -> None:
        self.runner.crop_rows(torch.zeros(len(self.base), dtype=torch.long))

    def prefill(self, slot: int, state: DecodeState, out=None) -> None:
        self.runner.reset_row(slot)
        if state.prompt_len > 1:
            self.runner.forward_row(slot, state.tokens[:-1], last_only=True)

    def propose(self, slots: list[int], states: list[DecodeState], gammas: list[int]) -> list[DraftBlock]:
        rows = max(slots) + 1  # the forward covers rows 0..rows-1; free slots ride along as padding
        lengths = self.runner.lengths[:rows].clone()  # [rows] before this draft
        feeds = {s: state.tokens[int(lengths[s]):] for s, state, g in zip(slots, states, gammas) if g > 0}
        drafts = {s: ([], [], []) for s in feeds}  # slot -> (tokens, probs, confidence)
        by_slot = dict(zip(slots, states))
        for i in range(max(gammas, default=0)):
            if not feeds:
                break
            width = max(len(feed) for feed in feeds.values())
            ids = torch.zeros(rows, width, dtype=torch.long)
            for s, feed in feeds.items():
                ids[s, : len(feed)] = torch.tensor(feed)
                ids[s, len(feed) :] = feed[-1]
            logits = self.runner.forward_batch(ids).logits  # [rows, width, V]
            for s, feed in feeds.items():
                lengths[s] += len(feed)
            self.runner.crop_rows(lengths)  # padding and idle rows drop what they were fed
            done = []
            for s, feed in feeds.items():
                token, p, top = self._pick(logits[s, len(feed) - 1], by_slot[s].rng)
                tokens, probs, confidence = drafts[s]
                tokens.append(token)
                confidence.append(top)
                if p is not None:
                    probs.append(p)
                stop = by_slot[s].early_stop
                if len(tokens) == gammas[slots.index(s)] or (stop is not None and stop(i, top)):
                    done.append(s)
                feeds[s] = [token]
            for s in done:
                del feeds[s]
        for s, state in zip(slots, states):
            self.base[s] = len(state.tokens)
        return [DraftBlock(torch.tensor(drafts[s][0], dtype=torch.long),
                           torch.stack(drafts[s][1]) if drafts[s][1] else None,
                           torch.tensor(drafts[s][2])) if s in drafts else DraftBlock.empty() for s in slots]

    def _pick(self, logits: torch.Tensor, rng: torch.Generator) -> tuple[int, torch.Tensor | None, float]:
        """One draft token from logits [V]: (token, its distribution if sampled, top probability)."""
        if self.sampling.greedy:
            token = int(logits.argmax())
            return token, None, float(torch.softmax(logits.float(), -1)[token])
        p = self.sampling.probs(logits)  # [V] float32, same transform as the target
        return int(sample(p, rng)), p, float(p.max())

    def commit(self, slots: list[int], verdicts: list[Verdict], out: TargetOutput) -> None:
        lengths = self.runner.lengths.clone()
        for s, verdict in zip(slots, verdicts):
            if verdict.gamma > 0:  # as ModelDrafter.commit, per row
                lengths[s] = self.base[s] + min(verdict.n_accepted, verdict.gamma - 1)
        self.runner.crop_rows(lengths)

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}
