"""`proposer=medusa`: K heads on the target's last hidden state guess the next K tokens at once.

No second model and no draft forward passes: after each verdict the feature of the token that
produced the next token (the target's LM-head input, which the verify forward hands over)
feeds every head once. The first step of a generation has no feature yet and drafts
nothing. With sampling the heads' distributions go to the verifier as draft_probs, so the
rejection verifier stays lossless; `verifier=typical` is Medusa's own (lossy) acceptance.
"""

from __future__ import annotations

import torch

from specpipe.errors import SpecpipeError
from specpipe.engine import FINAL, Runner, TargetOutput
from specpipe.heads.io import load_medusa
from specpipe.heads.medusa import MedusaHeads
from specpipe.models.quantize import module_bytes
from specpipe.proposers.base import BatchProposer, Proposer
from specpipe.proposers.declaration import Declaration
from specpipe.sampling import SamplingParams, sample
from specpipe.state import DecodeState
from specpipe.types import DraftBlock, DraftTree, Verdict


class MedusaProposer(Proposer):
    hidden_layers = (FINAL,)

    def __init__(self, heads: MedusaHeads, sampling: SamplingParams, tree: list[list[int]] | None = None):
        self.heads = heads
        self.sampling = sampling
        self.tree = None if tree is None else check_tree(tree, heads.num_heads)
        self.target: Runner | None = None
        self.feature: torch.Tensor | None = None  # [H] of the last committed token's predecessor row

    def bind(self, target: Runner) -> None:
        self.target = target

    def prefill(self, state: DecodeState, out: TargetOutput | None) -> None:
        self.feature = None

    @torch.inference_mode()
    def propose(self, state: DecodeState, gamma: int) -> DraftBlock:
        if self.feature is None:
            return DraftBlock.empty()
        gamma = min(gamma, self.heads.num_heads)
        logits = self.heads(self.feature[None], self.target.lm_head, heads=gamma)[:, 0]  # [γ, V]
        if self.tree is not None:
            return self._tree(logits)
        return self.chain(logits, state.rng)

    def chain(self, logits: torch.Tensor, rng: torch.Generator) -> DraftBlock:
        """The heads' logits [γ, V] -> a chain draft: argmax, or sampled with the target's transform."""
        if self.sampling.greedy:
            tokens = logits.argmax(-1)
            return DraftBlock(tokens, None, torch.softmax(logits, -1).max(-1).values)
        probs = self.sampling.probs(logits)  # [γ, V] float32, the target's transform
        return DraftBlock(sample(probs, rng), probs, probs.max(-1).values)

    @property
    def batch_refusal(self) -> str | None:
        if self.tree is not None:
            return "a tree draft's mask differs per row, which the batched forward does not take yet"
        return None

    def batched(self, slots: int) -> "BatchMedusa":
        return BatchMedusa(self, slots)

    def _tree(self, logits: torch.Tensor) -> DraftTree:
        """The configured candidate paths no deeper than γ: path [i, j] is head 1's i-th best
        token followed by head 2's j-th best."""
        choices = [c for c in self.tree if len(c) <= logits.shape[0]]
        ranked = logits.topk(1 + max(max(c) for c in choices), dim=-1).indices  # [γ, k]
        index = {tuple(c): i for i, c in enumerate(choices)}
        tokens = torch.stack([ranked[len(c) - 1, c[-1]] for c in choices])
        parents = tuple(index[tuple(c[:-1])] if len(c) > 1 else -1 for c in choices)
        return DraftTree(tokens, parents)

    def memory(self) -> dict[str, int]:
        return {"heads": module_bytes(self.heads)}  # the shared LM head is the target's

    def commit(self, verdict: Verdict, out: TargetOutput) -> None:
        # the verify row that predicted the token just emitted: its feature drafts the next ones
        self.feature = out.hidden[FINAL][0, verdict.last_row]


class BatchMedusa(BatchProposer):
    """Medusa over a batch: one heads call (and one shared LM-head matmul) for every row."""

    def __init__(self, medusa: MedusaProposer, slots: int):
        self.medusa = medusa
        self.features: list[torch.Tensor | None] = [None] * slots  # per slot, as MedusaProposer.feature

    def prefill(self, slot: int, state: DecodeState, out: TargetOutput | None) -> None:
        self.features[slot] = None

    @torch.inference_mode()
    def propose(self, slots: list[int], states: list[DecodeState], gammas: list[int]) -> list[DraftBlock]:
        ready = [i for i, (s, g) in enumerate(zip(slots, gammas)) if g > 0 and self.features[s] is not None]
        drafts = [DraftBlock.empty()] * len(slots)
        if not ready:
            return drafts
        heads = min(max(gammas[i] for i in ready), self.medusa.heads.num_heads)
        features = torch.stack([self.features[slots[i]] for i in ready])  # [m, H]
        logits = self.medusa.heads(features, self.medusa.target.lm_head, heads=heads)  # [K, m, V]
        for j, i in enumerate(ready):
            drafts[i] = self.medusa.chain(logits[: min(gammas[i], heads), j], states[i].rng)
        return drafts

    def commit(self, slots: list[int], verdicts: list[Verdict], out: TargetOutput) -> None:
        for s, verdict in zip(slots, verdicts):
            self.features[s] = out.hidden[FINAL][s, verdict.last_row]

    def memory(self) -> dict[str, int]:
        return self.medusa.memory()


def check_tree(tree: list[list[int]], num_heads: int) -> list[list[int]]:
    """Medusa's `medusa_choices`, checked and ordered so that parents come first."""
    paths = sorted({tuple(int(i) for i in path) for path in tree}, key=lambda p: (len(p), p))
    for path in paths:
        if not path or min(path) < 0 or len(path) > num_heads or (len(path) > 1 and path[:-1] not in paths):
            raise SpecpipeError(
                f"proposer.tree has the path {list(path)}: every path must be non-empty, of non-negative ranks, "
                f"at most {num_heads} long (one rank per head), and its prefixes must be paths too, e.g. "
                "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]."
            )
    return [list(p) for p in paths]


def validate_options(options: dict) -> None:
    """The tree's shape, checked before the heads load (`check_tree` then bounds it by them)."""
    tree, num_heads = options.get("tree"), options.get("num_heads")
    if tree is not None and not all(isinstance(path, list) and all(type(i) is int for i in path) for path in tree):
        raise SpecpipeError(f"proposer.tree={tree!r} must be a list of paths, each a list of ranks, e.g. "
                            "[[0], [1], [0, 0], [0, 1]]")
    if num_heads is not None and num_heads < 1:
        raise SpecpipeError(f"proposer.num_heads={num_heads} must be at least 1 (or null: all heads)")


def build(*, context, heads: str, num_heads: int | None = None, tree: list | None = None) -> MedusaProposer:
    """heads: a folder written by `specpipe train proposer=medusa` (checked against the target
    before any weights load); num_heads: use only the first ones; tree: candidate paths
    (`medusa_choices`), verified in one forward, or None for a chain."""
    loaded = load_medusa(heads)
    if num_heads is not None:
        loaded.num_heads = max(1, min(num_heads, loaded.num_heads))
    return MedusaProposer(loaded, context.sampling, tree)


def _vllm(plan) -> None:
    from specpipe.export.vllm import VERSION

    plan.warnings.append(f"vLLM {VERSION} has no Medusa (method medusa is gone from its SpeculativeConfig): the "
                         "command serves the plain target and the heads' speedup is lost. Train an EAGLE head "
                         "(specpipe train proposer=eagle), which both engines serve.")
    return None


def _sglang(plan) -> None:
    from specpipe.export.sglang import ALGORITHMS, VERSION

    plan.warnings.append(f"SGLang {VERSION} has no Medusa (its algorithms: {', '.join(ALGORITHMS)}): the command "
                         "serves the plain target, and the heads' speedup is lost. Train an EAGLE head "
                         "(specpipe train proposer=eagle), which both engines serve.")
    return None


DECLARATION = Declaration("medusa", heads=True, hidden="last", tree="option", trainer="specpipe.train.medusa",
                          export={"vllm": _vllm, "sglang": _sglang})
