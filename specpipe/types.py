"""The small typed objects passed between the parts of one decode step.

Glossary (DESIGN.md vocabulary): the *target* is the model whose output is preserved; the
*draft* is what a proposer guesses; γ (`gamma`) is the number of draft tokens in a step.
*accepted* draft tokens are kept; the *recovered* token is resampled at the first rejection;
the *bonus* token is the extra target token after all γ were accepted. Every step emits
n_accepted + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftBlock:
    """A chain of γ guessed tokens.

    tokens: [γ] int64. probs: [γ, V] float32 draft distributions the tokens were sampled
    from (after the same temperature/top-k/top-p as the target), or None for a model-free or
    greedy draft, which verifiers treat as one-hot on `tokens` (still lossless).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [γ] the drafter's top probability at each token

    @property
    def gamma(self) -> int:
        return int(self.tokens.numel())

    def ancestry(self) -> None:
        """A chain needs no tree mask: token i follows token i-1 (see DraftTree)."""
        return None

    @staticmethod
    def empty() -> "DraftBlock":
        return DraftBlock(torch.empty(0, dtype=torch.long))


@dataclass(frozen=True)
class DraftTree:
    """Several candidate continuations sharing prefixes, verified in ONE target forward.

    tokens: [N] int64 node tokens. parents: N ints, the parent node of each (-1: the node
    follows the last committed token); a parent comes before its children and siblings carry
    different tokens. The verify block is [last token, *tokens]: block row 0 is the last token,
    row i+1 is node i. γ is the tree's depth (its longest candidate).
    """

    tokens: torch.Tensor
    parents: tuple[int, ...]
    confidence: torch.Tensor | None = None
    probs = None  # trees are verified greedily or by typical acceptance, never by rejection

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Depth of each node (1 for children of the last committed token)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    @property
    def gamma(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is `node` (-1: the last committed token)."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def ancestry(self) -> torch.Tensor:
        """[N+1, N+1] bool over block rows: row r may attend to row c (itself, its ancestors, row 0)."""
        allowed = torch.eye(self.size + 1, dtype=torch.bool)
        allowed[:, 0] = True
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                allowed[node + 1] |= allowed[parent + 1]
        return allowed

    def leaf_paths(self) -> list[list[int]]:
        """Every root-to-leaf candidate as node indices."""
        leaves = [i for i in range(self.size) if not self.children(i)]
        return [self.path_to(leaf) for leaf in leaves]

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


@dataclass(frozen=True)
class Verdict:
    """What one target forward decided about a draft.

    n_accepted: how many leading draft tokens are kept (0..γ). next_token: the recovered token
    (n_accepted < γ) or the bonus token (n_accepted == γ). gamma: the draft length verified.
    """

    n_accepted: int
    next_token: int
    gamma: int
    accepted_tokens: tuple[int, ...] = ()
    confidence: tuple[float, ...] = ()  # the draft's, passed on for controllers that learn from it
    path: tuple[int, ...] = ()  # tree drafts: the verify block rows of the accepted nodes

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted_tokens, self.next_token]

    @property
    def last_row(self) -> int:
        """The verify block row whose prediction is next_token."""
        return self.path[-1] if self.path else self.n_accepted


@dataclass(frozen=True)
class StepTiming:
    """Wall-clock seconds of one step's two phases."""

    propose_s: float
    verify_s: float

    @property
    def total_s(self) -> float:
        return self.propose_s + self.verify_s
