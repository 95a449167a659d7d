"""`proposer=ngram`: prompt lookup decoding, no model needed.

Find the most recent earlier occurrence of the last n tokens (n from `ngram_max` down to
`ngram_min`) in the prompt plus what was generated so far, and propose the tokens that followed
it. Pays on inputs the answer repeats (code edits, summaries, multi-turn chat). The draft has no
probabilities: verifiers treat it as one-hot, which stays lossless.
"""

from __future__ import annotations

import numpy as np

from specpipe.declaration import Declaration
from specpipe.drafts import DraftBatch
from specpipe.errors import SpecpipeError
from specpipe.proposers.base import Proposer
from specpipe.types import Rows


class NgramProposer(Proposer):
    def __init__(self, ngram_max: int = 4, ngram_min: int = 2):
        if not 1 <= ngram_min <= ngram_max:
            raise SpecpipeError(
                f"proposer.ngram_min={ngram_min} and proposer.ngram_max={ngram_max} must satisfy "
                "1 <= ngram_min <= ngram_max (e.g. ngram_min=2 ngram_max=4)."
            )
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.index: dict[int, _Index] = {}  # per row: its text's n-grams, kept up to date step by step

    def prefill(self, row: int, prompt: list[int], out=None) -> None:
        self.index[row] = _Index(range(self.ngram_min, self.ngram_max + 1))

    def release(self, row: int, tokens: list[int]) -> None:
        self.index.pop(row, None)

    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        """Every row's lookup, on the host: the batch's host tensors."""
        found = [self.lookup(rows.tokens[b], gamma, b) if gamma > 0 else None for b, gamma in enumerate(gammas)]
        return DraftBatch.of_lists(gammas, [None if f is None else f[0] for f in found])

    def lookup(self, committed: list[int], gamma: int, row: int | None = None,
               trees: bool = False) -> tuple[list[int], None] | None:
        """What followed the latest earlier occurrence of the text's last n tokens (n from
        ngram_max down), at most γ tokens; None where nothing matches. Host work only. With the
        `row` of a request this proposer was told of (`prefill`), from the row's index of its
        n-grams (each step adds its new tokens' n-grams: constant work however long the text),
        else by scanning the text. -> (tokens, None): its drafts are chains (`trees` and the
        parents are a suffix lookup's)."""
        index = self.index.get(row) if row is not None else None
        if index is not None:
            start, n = index.find(committed)
            return None if start is None else (committed[start + n : start + n + gamma], None)
        tokens = np.asarray(committed, dtype=np.int64)  # [L]
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            start = _last_match(tokens, n)
            if start is not None:
                return tokens[start + n : start + n + gamma].tolist(), None
        return None


class _Index:
    """The latest start of every n-gram of a text that has a successor (n in `sizes`), as the
    text grows: what `_last_match` finds by a scan, without one."""

    def __init__(self, sizes: range):
        self.sizes = sizes
        self.latest: dict[tuple[int, ...], int] = {}
        self.seen = 0  # the n-grams ending before positions 1..seen are indexed (each followed by its token)

    def find(self, tokens: list[int]) -> tuple[int | None, int]:
        """(start, n) of the latest earlier occurrence of the text's last n tokens, the longest
        n first; (None, 0) where none has."""
        for end in range(self.seen + 1, len(tokens)):  # tokens[end] follows the n-grams ending before it
            for n in self.sizes:
                if end >= n:
                    self.latest[tuple(tokens[end - n : end])] = end - n
        self.seen = max(self.seen, len(tokens) - 1)
        for n in reversed(self.sizes):
            if n < len(tokens):
                start = self.latest.get(tuple(tokens[-n:]))
                if start is not None:
                    return start, n
        return None, 0


def _last_match(tokens: np.ndarray, n: int) -> int | None:
    """Start of the most recent earlier occurrence of the last n tokens, if any follows it."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [L-n, n]: every n-gram with a successor
    hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
    return int(hits[-1]) if hits.size else None


def validate_options(options: dict) -> None:
    """The match lengths, checked by `check` and `export` as the build checks them."""
    NgramProposer(options.get("ngram_max", 4), options.get("ngram_min", 2))


def build(*, context, ngram_max: int = 4, ngram_min: int = 2) -> NgramProposer:
    return NgramProposer(ngram_max=ngram_max, ngram_min=ngram_min)


def _vllm(plan) -> dict:
    return {"method": "ngram", "num_speculative_tokens": plan.gamma,
            "prompt_lookup_min": int(plan.options["ngram_min"]), "prompt_lookup_max": int(plan.options["ngram_max"])}


def _sglang(plan) -> dict:
    plan.warnings.append(f"proposer.ngram_min / ngram_max: SGLang {plan.version} has no match-window flags; its NGRAM "
                         "matches any suffix up to --speculative-ngram-max-trie-depth (18) in a trie of earlier "
                         "prompts and outputs, so it may draft where specpipe's lookup would not.")
    return {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": plan.gamma + 1,
            "--speculative-ngram-min-bfs-breadth": 1, "--speculative-ngram-max-bfs-breadth": 1}


DECLARATION = Declaration("ngram", draft_probs=False, peer="hf-prompt-lookup",
                          export={"vllm": _vllm, "sglang": _sglang})
