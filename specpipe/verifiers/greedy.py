"""Greedy verification: keep draft tokens while they equal the target's argmax.

Output is token-identical to plain greedy decoding of the target (given a batch-invariant
target precision, see docs/concepts.md "Lossless in practice").
"""

from __future__ import annotations

import torch

from specpipe.drafts import DraftBatch
from specpipe.engine.base import Tail
from specpipe.errors import Refusal, refuse
from specpipe.types import PAD, Verdict
from specpipe.verifiers.base import TreeRows, Verifier, block_ids, leading, tree_verdict


class GreedyVerifier(Verifier):
    def verify(self, draft: DraftBatch, target_logits: torch.Tensor, rngs=None) -> Verdict:
        """A chain's verdict is `chain_tail`, the function a static step runs inside its graph,
        here over the exact block (no padding): one body for both."""
        if draft.tree is not None:
            return _tree(draft, target_logits.argmax(-1))  # [B, N + 1]: one argmax per block row
        return self.verdict_of(chain_tail(target_logits, block_ids(draft), draft.num_draft), draft)

    def tail(self, draft: DraftBatch, rngs=None) -> Tail | None:
        """A chain's verdict inside the verify forward's graph (a tree's is verified from the logits)."""
        if draft.tree is not None:
            return None
        return Tail("greedy", chain_tail, list(draft.counts) if draft.counts is not None else draft.num_draft)


def chain_tail(logits: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The greedy verdict of a padded verify block, packed (`Verdict.packed`): logits [R, K, V]
    of the block ids [R, K] (row r's draft in ids[r, 1 : 1 + counts[r]], padding after) ->
    [R, K + 2]: the argmax up to the first one that differs from the draft token it checks
    (the accepted tokens, then the recovered or bonus one), PAD after; num_accepted; counts.
    Tensor ops on the buffers alone (no host reads, no shape from a value), so a graph can
    capture it; `verify` runs it eagerly. A kept draft token is the argmax at its column, and
    the next token (recovered or bonus) the argmax after the kept ones: the verdict is the
    argmax, cut after column num_accepted (fewer launches than building it from the draft)."""
    top = logits.argmax(-1)  # [R, K]
    if ids.shape[1] == 1:  # a plain step's block: nothing drafted (counts all 0, so none accepted)
        return torch.cat([top, counts[:, None], counts[:, None]], 1)  # two kernels, where the chain's are ten
    columns = torch.arange(ids.shape[1], device=ids.device)  # [K]
    right = (top[:, :-1] == ids[:, 1:]) & (columns[None, :-1] < counts[:, None])  # [R, K - 1]
    num_accepted = leading(right)  # [R]
    verdict = top.masked_fill(columns[None] > num_accepted[:, None], PAD)
    return torch.cat([verdict, num_accepted[:, None], counts[:, None]], 1)


def _tree(draft: DraftBatch, top: torch.Tensor) -> Verdict:
    """top [B, N + 1]. A node is right when its token is its parent row's argmax; siblings
    differ, so a row's nodes whose whole path is right form one path: keep its deepest node's."""
    tree = TreeRows(draft.tree)
    right = draft.tokens == top.gather(1, tree.parent_rows)  # [B, N]
    return tree_verdict(draft, tree, right, top)


def build(*, context) -> GreedyVerifier:
    refuse(temperature_refusal(context.sampling.temperature))
    return GreedyVerifier()


def temperature_refusal(temperature: float) -> Refusal | None:
    """verifier=greedy at `temperature` (None: 0, what it honours)."""
    if temperature <= 0:
        return None
    return Refusal(f"verifier=greedy cannot honour temperature={temperature}: it keeps only argmax tokens",
                   "use verifier=rejection to sample losslessly, or temperature=0")
