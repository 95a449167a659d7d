"""Speculative rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), batched.

Each draft token x_i drawn from draft_probs_i is accepted with probability
min(1, target_probs_i[x_i] / draft_probs_i[x_i]). At the first rejection the recovered token
is drawn from norm(max(0, target_probs_i - draft_probs_i)); if all γ are accepted the bonus
token is drawn from target_probs_γ. The emitted tokens are distributed exactly as plain
sampling from the target. A draft without probabilities (model-free or greedy drafter) is
treated as one-hot on its tokens: accepted with probability target_probs_i[x_i], which stays
lossless. Probabilities and ratios are float32; the draws are the step's `StepRandom`'s: one
launch per purpose for the rows without a seed, each seeded row from its own stream.

Shapes: B rows, W draft columns, V vocabulary. target_probs [B, W + 1, V]; uniforms [B, W].
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from specpipe.drafts import DraftBatch
from specpipe.engine.base import Tail, TailInputs
from specpipe.errors import Refusal, refuse
from specpipe.sampling import ACCEPT, RESAMPLE, SamplingParams, StepRandom, race
from specpipe.types import PAD, Verdict
from specpipe.verifiers.base import Verifier, block_ids, leading


class RejectionVerifier(Verifier):
    """Algorithm 1, token by token. A variant with another acceptance rule over the same draws
    (block verification) names itself and swaps `rule`: the draws, the graph tail and the
    verdict stay this class's."""

    verifies_trees = False
    name = "rejection"  # the config's choice (verifier=NAME): messages and the tail's graph key

    def __init__(self, sampling: SamplingParams):
        self.sampling = sampling

    @staticmethod
    def rule(target_probs: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor | None,
             uniform: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num_accepted [B], the recovered or bonus token [B]): `decide`'s signature."""
        return decide(target_probs, tokens, counts, probs, uniform, draws)

    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs: StepRandom) -> Verdict:
        """`chain_tail`, the function a static step runs inside its graph, here over the exact
        block, with the draws `tail` fills its buffers with (`_draw`) and the draft's own
        probabilities (no copy): one body for both, the same draws from the same streams."""
        _chains_only(draft, self.name)
        device = target_logits.device
        uniform = torch.ones(draft.rows, draft.width, device=device)  # [B, W] columns past a row's γ: unused
        draws = torch.empty(draft.rows, target_logits.shape[-1], device=device)  # [B, V]
        _draw(draft, rngs, uniform, draws)
        packed = chain_tail(self.sampling, target_logits, block_ids(draft), draft.num_draft, uniform, draws,
                            draft.probs, rule=self.rule)
        return self.verdict_of(packed, draft)

    def tail(self, draft: DraftBatch, rngs: StepRandom) -> Tail | None:
        """The verdict inside the verify forward's graph: the rows' draws (`verify`'s, from the same
        streams, drawn straight into the tail's buffers) and the draft's probabilities are its
        inputs, so only the packed verdict leaves the graph (vLLM's rejection sampler runs on the
        device the same way)."""
        _chains_only(draft, self.name)
        probs = draft.probs

        def fill(buffers: list[torch.Tensor]) -> None:  # uniform [R, K - 1], draws [R, V], probs [R, K - 1, V]
            _draw(draft, rngs, buffers[0], buffers[1])
            if probs is not None:
                buffers[2][: probs.shape[0], : probs.shape[1]].copy_(probs)

        def sizes(block: int, vocab: int) -> tuple[tuple[int, ...], ...]:
            columns = (block - 1,)
            return (columns, (vocab,)) if probs is None else (columns, (vocab,), (*columns, vocab))

        counts = list(draft.counts) if draft.counts is not None else draft.num_draft
        name = f"{self.name} {self.sampling}" + ("" if probs is None else " with the draft's probabilities")
        return Tail(name, partial(chain_tail, self.sampling, rule=self.rule), counts, TailInputs(fill, sizes))


def _draw(draft: DraftBatch, rngs: StepRandom | list, uniform: torch.Tensor, draws: torch.Tensor) -> None:
    """The rows' draws into rows 0..B-1 of uniform [R, C] (the block's W columns: a graph's
    buffer is wider) and draws [R, V] (the race's, for the recovered or bonus token): one launch
    each for the rows without a seed, laid out by the rows' γ, not by the block's or the
    buffer's width, so the eager step and the graph draw alike; a seeded row draws its own γ
    uniforms, so its draws never depend on its neighbours."""
    rngs, rows = StepRandom.of(rngs), draft.rows
    rngs.uniform_(uniform[:rows, : draft.width], ACCEPT, list(draft.gammas))
    rngs.exponential_(draws[:rows], RESAMPLE)


def chain_tail(sampling: SamplingParams, logits: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor,
               uniform: torch.Tensor, draws: torch.Tensor, probs: torch.Tensor | None = None, *,
               rule: Callable | None = None) -> torch.Tensor:
    """The rejection verdict of a padded verify block, packed (`Verdict.packed`): logits [R, K, V]
    of the block ids [R, K] (row r's draft in ids[r, 1 : 1 + counts[r]]), the rows' uniforms
    [R, K - 1] and race draws [R, V], the draft's probabilities [R, K - 1, V] (None: one-hot)
    -> [R, K + 2]: the accepted draft tokens, the recovered or bonus one, PAD after;
    num_accepted; counts. Columns past a row's count hold stale values, masked by the count.
    rule: the acceptance rule, `decide`'s signature (None: `decide`)."""
    tokens = ids[:, 1:]  # [R, K - 1]: column j checks draft token j
    num_accepted, picks = (rule or decide)(sampling.probs(logits), tokens, counts, probs, uniform, draws)
    columns = torch.arange(ids.shape[1], device=ids.device)  # [K]
    verdict = torch.where(columns[None] < num_accepted[:, None], ids.roll(-1, 1), PAD)  # column K - 1 never kept
    verdict.scatter_(1, num_accepted[:, None], picks[:, None])
    return torch.cat([verdict, num_accepted[:, None], counts[:, None]], 1)


def decide(target_probs: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor | None,
           uniform: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 on every row at once. target_probs [B, W + 1, V], tokens [B, W], counts [B]
    (the columns each row drafted), the draft's probabilities [B, W, V] (None: one-hot),
    uniform [B, W], the race's draws [B, V] -> (num_accepted [B], the recovered or bonus token [B])."""
    width = tokens.shape[1]
    target_p = target_probs[:, :width].gather(-1, tokens[..., None])[..., 0]  # [B, W]
    draft_p = torch.ones_like(target_p) if probs is None else probs.gather(-1, tokens[..., None])[..., 0].float()
    drafted = torch.arange(width, device=tokens.device)[None] < counts[:, None]  # [B, W]
    # accept iff u < target_p / draft_p, written without a division (target >= draft: always)
    num_accepted = leading((uniform * draft_p < target_p) & drafted)  # [B]
    at = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    final = target_probs.gather(1, at)[:, 0]  # [B, V] the target at the first rejection or bonus row
    rejected = (num_accepted < counts)[:, None]  # [B, 1]
    residual = (final - torch.where(rejected, draft_dist(tokens, probs, num_accepted, final), 0.0)).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), final)  # rounding left nothing: the target
    return num_accepted, race(residual, draws)


# the verifiers that take one chain, and why a tree cannot be verified by them
CHAINS_ONLY = {
    "rejection": "verifier=rejection verifies chains, and proposer.tree drafts a tree",
    "block": "verifier=block verifies one chain, and proposer.tree drafts a tree: block verification keeps the "
             "longest prefix of a single drafted chain, weighing each prefix by its joint target/draft probability "
             "ratio and drawing the next token from a residual of that chain's draft distribution; a tree offers "
             "several siblings at each depth, picked by top-k rather than sampled, so no single draft "
             "distribution weighs them and the target's distribution would not be kept (the paper's guarantee is "
             "for one draft chain; verifying several paths losslessly is another algorithm)",
}


def tree_refusal(name: str) -> Refusal | None:
    """verifier=`name` given a tree draft (None: it verifies trees). `specpipe check` reports it
    where a config asks for a tree; a step raises it should a tree reach the verifier anyway."""
    if name not in CHAINS_ONLY:
        return None
    return Refusal(CHAINS_ONLY[name], "use proposer.tree=null, or verifier=greedy / verifier=typical with the tree")


def _chains_only(draft: DraftBatch, name: str) -> None:
    if draft.tree is not None:
        refuse(tree_refusal(name))


def draft_dist(tokens: torch.Tensor, probs: torch.Tensor | None, at: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, V]: each row's draft distribution at column `at` (clamped into the block; unused where
    the row accepted everything)."""
    width = tokens.shape[1]
    if width == 0:
        return torch.zeros_like(like)
    column = at.clamp_max(width - 1)[:, None]  # [B, 1]
    if probs is None:
        return torch.zeros_like(like).scatter_(1, tokens.gather(1, column), 1.0)
    return probs.gather(1, column[..., None].expand(-1, 1, like.shape[-1]))[:, 0].float()


def build(*, context) -> RejectionVerifier:
    return RejectionVerifier(context.sampling)
