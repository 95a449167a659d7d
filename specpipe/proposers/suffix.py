"""`proposer=suffix`: suffix decoding (SuffixDecoding, Oliaro et al. 2024; Arctic Inference,
vLLM `method: suffix`), model-free.

Two suffix trees of bounded depth count every substring (up to `max_depth` tokens) seen so far:
one over this request's prompt and output, one global over earlier requests' outputs (each after
the last `max_depth` tokens of its prompt, so a repeated request matches at once) in this
process (bounded by `max_cached_requests` and `max_cached_tokens`, least recently used evicted).
A step finds the longest suffix of the text so far that the tree holds, then grows a draft from
that node, most probable continuation first, a continuation's probability being the product of
the shares of the counts along its path; growth stops at `min_token_prob`, at γ tokens, and at
`max_spec_factor` × match length + `max_spec_offset` tokens (a long match earns a long draft:
γ adapts to how much the text repeats). Of the two trees' drafts the one with the higher score
(the expected number of accepted tokens) is used. It drafts a tree verified in one forward,
or its best path where the verifier or a batch needs a chain. The draft has no probabilities:
verifiers treat it as one-hot, which stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specpipe.declaration import Declaration
from specpipe.drafts import DraftBatch
from specpipe.errors import SpecpipeError
from specpipe.proposers.base import Proposer
from specpipe.proposers.suffix_tree import NODE_BYTES, NOTHING, RequestCache, Speculation, SuffixTree, grow
from specpipe.types import Rows

DEFAULT_BOUNDS = (24, 1000, 50000)  # max_depth, max_cached_requests, max_cached_tokens: conf/proposer/suffix.yaml's


@dataclass
class _Local:
    """One request's tree over its prompt and output, and how far it has read them."""

    tree: SuffixTree
    open: list[int]
    seen: int  # committed tokens in the tree
    prompt_len: int
    held: list[int] | None = None  # the text's suffixes in the global tree (`SuffixTree.follow`)
    held_at: int = -1  # the global tree's version they were read at


class SuffixProposer(Proposer):
    def __init__(self, cache: RequestCache, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, tree: bool = True, min_score: float | None = None,
                 min_match: int = 1):
        """min_score: as another proposer's lookup (`lookup`), the score a draft needs to be taken
        (None: the step's γ, Arctic Inference's rule against a model speculator); min_match: the
        shortest match of the text's last tokens that drafts."""
        self.cache = cache  # the global tree, shared by every row
        self.factor, self.offset, self.min_prob = max_spec_factor, max_spec_offset, min_token_prob
        self.trees = tree  # False: the best path only (a step that takes no tree gets it anyway)
        self.min_score, self.min_match = min_score, min_match
        self.local: dict[int, _Local] = {}  # per row: its request's tree

    def prefill(self, row: int, prompt: list[int], out=None) -> None:
        local = SuffixTree(self.cache.tree.depth)
        self.local[row] = _Local(local, local.extend(local.start(), prompt), len(prompt), len(prompt))

    def release(self, row: int, tokens: list[int]) -> None:
        """The finished request's output joins the global tree, after the prompt's last max_depth
        tokens (so a repeated prompt matches into it)."""
        local = self.local.get(row)  # kept until the row's next prefill (what it drafted from stays readable)
        if local is not None:
            start = max(local.prompt_len - local.tree.depth, 0)
            self.cache.add(tokens[start:], local.prompt_len - start)

    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        """Every row's draft, grown on the host: the batch's host tensors (a tree batch where a
        row drafted a tree and the step takes trees)."""
        found = [self._use(self._speculate(b, rows.tokens[b], gamma, rows.trees)) if gamma > 0 else None
                 for b, gamma in enumerate(gammas)]
        return DraftBatch.of_lists(gammas, [None if f is None else f[0] for f in found],
                                   [None if f is None else f[1] for f in found])

    def lookup(self, committed: list[int], gamma: int, row: int,
               trees: bool = False) -> tuple[list[int], list[int] | None] | None:
        """The draft where its score (expected accepted tokens) reaches `min_score` (None: γ),
        else None: suffix decoding as the lookup a model speculator tries first, where only a
        draft expected to do at least as well as the model's is worth skipping it for."""
        speculation = self._speculate(row, committed, gamma, trees)
        least = gamma if self.min_score is None else self.min_score
        return self._use(speculation) if speculation.tokens and speculation.score >= least - 1e-9 else None

    def _speculate(self, row: int, committed: list[int], gamma: int, trees: bool) -> Speculation:
        local = self.local[row]
        new = committed[local.seen:]  # what was committed since
        local.open = local.tree.extend(local.open, new)
        local.seen = len(committed)
        context = committed[-local.tree.depth:]
        # the local tree holds every suffix of the text: its open suffixes are its matches
        own = [(local.open[length], length) for length in range(1, len(context))]
        best = NOTHING
        for tree, found in ((local.tree, own), (self.cache.tree, self._shared(local, context, new))):
            for node, length in reversed(found):  # every match length, the longest first: it wins ties
                # (and the local tree's draft wins a tie with the global one's: it comes first)
                if length < self.min_match:
                    break
                if not tree.children[node]:  # seen only where a text ends, nothing to draft: the local
                    continue  # tree's longest suffixes, each at the one place it occurs, are most of them
                limit = min(gamma, int(length * self.factor + self.offset + 1e-6))
                if limit <= best.score:  # a draft scores at most its length, and shorter matches earn no longer
                    break
                speculation = grow(tree, node, limit, self.min_prob, self.trees and trees)
                if speculation.score > best.score:
                    best = replace(speculation, shared=tree is self.cache.tree)
        return best

    def _use(self, speculation: Speculation) -> tuple[list[int], list[int] | None] | None:
        if speculation.shared:  # a draft from an earlier request keeps that request cached
            self.cache.touch(self.cache.tree.last[speculation.node])
        return _draft(speculation)

    def _shared(self, local: _Local, context: list[int], new: list[int]) -> list[tuple[int, int]]:
        """`matches` of the global tree: the row's held suffixes walked on by the new tokens, or
        read again where the tree changed since (a request finished)."""
        tree = self.cache.tree
        if local.held_at != self.cache.version:
            local.held, local.held_at = tree.follow([0], context), self.cache.version
        else:
            local.held = tree.follow(local.held, new)
        return [(local.held[length], length) for length in range(1, min(len(local.held), len(context)))]

    def memory(self) -> dict[str, int]:
        local = sum(state.tree.nodes for state in self.local.values()) * NODE_BYTES
        return {"suffix trees": self.cache.bytes() + local}


def as_lookup(min_score: float | None, min_match: int) -> SuffixProposer:
    """proposer=suffix with its defaults, as the lookup another proposer tries first
    (`SuffixProposer.lookup`; proposer.lookup=suffix of eagle and eagle3)."""
    return SuffixProposer(RequestCache(*DEFAULT_BOUNDS), min_score=min_score, min_match=min_match)


def _draft(speculation: Speculation) -> tuple[list[int], list[int] | None] | None:
    """A speculation as (tokens, parents), parents None for a chain (no tree mask needed), or None."""
    if not speculation.tokens:
        return None
    if all(parent == i - 1 for i, parent in enumerate(speculation.parents)):
        return list(speculation.tokens), None
    return list(speculation.tokens), list(speculation.parents)


def validate_options(options: dict) -> None:
    problems = [f"proposer.{key}={options[key]} must be at least {low}" for key, low in
                (("max_depth", 2), ("max_cached_requests", 0), ("max_cached_tokens", 0), ("max_spec_factor", 0),
                 ("max_spec_offset", -1e9)) if key in options and options[key] < low]
    if "min_token_prob" in options and not 0 <= options["min_token_prob"] <= 1:
        problems.append(f"proposer.min_token_prob={options['min_token_prob']} must be a probability in [0, 1]")
    if problems:
        raise SpecpipeError("; ".join(problems) + " (see conf/proposer/suffix.yaml).")


def build(*, context, max_depth: int = 24, max_cached_requests: int = 1000, max_cached_tokens: int = 50000,
          max_spec_factor: float = 1.0, max_spec_offset: float = 0.0, min_token_prob: float = 0.1,
          tree: bool = True) -> SuffixProposer:
    validate_options(dict(max_depth=max_depth, max_cached_requests=max_cached_requests, min_token_prob=min_token_prob,
                          max_cached_tokens=max_cached_tokens, max_spec_factor=max_spec_factor))
    cache = RequestCache(max_depth, max_cached_requests, max_cached_tokens)
    return SuffixProposer(cache, max_spec_factor, max_spec_offset, min_token_prob, tree)




def _vllm(plan) -> dict:
    """vLLM's suffix method: γ is its upper bound on draft tokens. From 0.34 it runs on the GPU
    with a corpus of finished responses bounded in tokens (specpipe's max_cached_tokens); before,
    it ran Arctic Inference's cache, bounded in requests only."""
    options, lost = plan.options, []
    config = {"method": "suffix", "num_speculative_tokens": plan.gamma,
              "suffix_decoding_max_tree_depth": int(options["max_depth"]),
              "suffix_decoding_max_cached_requests": int(options["max_cached_requests"])}
    if "suffix_decoding_corpus_tokens" in plan.keys:
        config["suffix_decoding_corpus_tokens"] = _corpus_tokens(options)
        # no-ops there: its GPU speculator always drafts num_speculative_tokens, so they are not written
        lost.append(f"max_spec_factor={options['max_spec_factor']} and min_token_prob={options['min_token_prob']} "
                    "(vLLM always drafts γ tokens, however short the match)")
        needs = ""
    else:
        lost.append(f"max_cached_tokens={options['max_cached_tokens']} (it bounds requests only)")
        config.update({"suffix_decoding_max_spec_factor": float(options["max_spec_factor"]),
                       "suffix_decoding_min_token_prob": float(options["min_token_prob"])})
        needs = " needs `pip install arctic-inference`;"
    if options.get("max_spec_offset"):
        lost.append(f"max_spec_offset={options['max_spec_offset']} (vLLM passes 0)")
    if options.get("tree", True):
        lost.append("the tree (vLLM verifies the best path)")
    plan.warnings.append(f"suffix: vLLM {plan.version}{needs} not exported: {'; '.join(lost)}. The global tree "
                         "holds outputs only, not the prompts' ends before them.")
    return config


CORPUS_LIMIT = 1 << 31  # vLLM 0.34's bound on suffix_decoding_corpus_tokens (exclusive)


def _corpus_tokens(options) -> int:
    """max_cached_tokens as vLLM's corpus size; one it refuses is the recipe's error, named."""
    tokens = int(options["max_cached_tokens"])
    if not 0 <= tokens < CORPUS_LIMIT:
        raise SpecpipeError(f"proposer.max_cached_tokens={tokens}: vLLM's suffix_decoding_corpus_tokens, which it "
                            f"becomes, must lie in [0, 2**31). Lower it, or export with engine_version=0.33.0.")
    return tokens


def _sglang(plan) -> dict:
    """SGLang has no suffix decoding; its NGRAM is the nearest: a trie of earlier prompts and
    outputs, matched on the last tokens, drafted by frequency with match type PROB."""
    plan.warnings.append(f"suffix: SGLang {plan.version} has no suffix decoding; exported as NGRAM with match type PROB "
                         "(a frequency-ranked trie over prompts and outputs, the nearest): min_token_prob, "
                         "max_spec_factor / max_spec_offset (its drafts do not grow with the match) and the "
                         "request bounds are lost.")
    flags = {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": plan.gamma + 1,
             "--speculative-ngram-match-type": "PROB", "--speculative-ngram-max-trie-depth": int(plan.options["max_depth"])}
    if not plan.options.get("tree", True):
        flags.update({"--speculative-ngram-min-bfs-breadth": 1, "--speculative-ngram-max-bfs-breadth": 1})
    return flags


DECLARATION = Declaration("suffix", tree="auto", draft_probs=False, export={"vllm": _vllm, "sglang": _sglang})
