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

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, replace

import torch

from specpipe.declaration import Declaration
from specpipe.drafts import DraftBlock, DraftTree
from specpipe.errors import SpecpipeError
from specpipe.proposers.base import RowProposer
from specpipe.types import Rows

NODE_BYTES = 200  # one node: its children dict and three list slots (sys.getsizeof, a few children)
DEFAULT_BOUNDS = (24, 1000, 50000)  # max_depth, max_cached_requests, max_cached_tokens: conf/proposer/suffix.yaml's


class SuffixTree:
    """Every substring of up to `depth` tokens of the sequences added, with occurrence counts.
    Appending a token extends the (at most `depth`) suffixes that end at the sequence's end, so
    a sequence of n tokens costs O(n·depth) time and at most n·depth nodes.

    Nodes are indices into flat lists (node 0 is the root), their children dicts of ints: none of
    it is tracked by Python's cyclic garbage collector, whose full collections would otherwise
    walk every node (measured: pauses up to 0.39 s inside a propose with ~50k nodes as objects)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.children: list[dict[int, int]] = [{}]  # node -> {token: child node}
        self.count: list[int] = [0]  # occurrences of the substring ending at the node
        self.last: list[int] = [-1]  # the latest sequence inserted through the node (for LRU touches)
        self.free: list[int] = []  # removed nodes, reused

    @property
    def nodes(self) -> int:
        return len(self.count) - len(self.free) - 1

    def start(self) -> list[int]:
        """The open suffixes of a new, empty sequence (only the empty one, the root)."""
        return [0]

    def append(self, open_: list[int], token: int, sequence: int = -1) -> list[int]:
        """Extend each open suffix by `token`; returns the new open suffixes (index = length)."""
        grown = [0]
        for node in open_[: self.depth]:
            child = self.children[node].get(token)
            if child is None:
                child = self.children[node][token] = self._new()
            self.count[child] += 1
            self.last[child] = sequence
            grown.append(child)
        return grown

    def extend(self, open_: list[int], tokens, sequence: int = -1) -> list[int]:
        for token in tokens:
            open_ = self.append(open_, int(token), sequence)
        return open_

    def remove(self, tokens: list[int]) -> None:
        """Take one added sequence out again (counts down, emptied nodes dropped)."""
        for start in range(len(tokens)):
            node = 0
            for token in tokens[start : start + self.depth]:
                child = self.children[node][token]
                self.count[child] -= 1
                if self.count[child] == 0:  # its descendants counted no more than it: all empty now
                    del self.children[node][token]
                    self._drop(child)
                    break
                node = child

    def matches(self, context: list[int]):
        """(node, length) of every suffix of `context` the tree holds, shortest first (a suffix
        the tree lacks has no longer one either), up to len(context) - 1 tokens and depth - 1."""
        for length in range(1, min(len(context), self.depth)):
            node = 0
            for token in context[-length:]:
                node = self.children[node].get(token)
                if node is None:
                    return
            yield node, length

    def follow(self, held: list[int], tokens) -> list[int]:
        """`append` without adding: held [root, the node of the text's 1-token suffix, of its
        2-token suffix, ...] (as far as the tree holds them) -> the same after `tokens`. Walking
        on from the last step's suffixes costs a lookup a length a new token, where `matches`
        walks every suffix from the root again (depth² lookups a step)."""
        children = self.children
        for token in tokens:
            grown = [0]
            for node in held[: self.depth - 1]:
                child = children[node].get(token)
                if child is None:
                    break
                grown.append(child)
            held = grown
        return held

    def match(self, context: list[int]) -> tuple[int, int] | None:
        """The longest suffix of `context` the tree holds with a continuation."""
        found = [(node, length) for node, length in self.matches(context) if self.children[node]]
        return found[-1] if found else None

    def _new(self) -> int:
        if self.free:
            node = self.free.pop()
            self.children[node], self.count[node], self.last[node] = {}, 0, -1
            return node
        self.children.append({})
        self.count.append(0)
        self.last.append(-1)
        return len(self.count) - 1

    def _drop(self, node: int) -> None:
        stack = [node]
        while stack:
            at = stack.pop()
            stack.extend(self.children[at].values())
            self.children[at] = {}
            self.free.append(at)


@dataclass(frozen=True)
class Speculation:
    tokens: list[int]
    parents: list[int]  # -1: follows the last committed token
    score: float  # expected accepted tokens under the tree's counts
    node: int = 0  # the matched node (its `last` sequence is touched when used)
    shared: bool = False  # grown from the global tree (earlier requests), not the request's own


NOTHING = Speculation([], [], 0.0)


def grow(tree: SuffixTree, node: int, limit: int, min_prob: float, branch: bool) -> Speculation:
    """At most `limit` continuations of `node`, most probable first (a child's probability: its
    parent's times count(child) / count(parent), so occurrences that end the text count against
    every continuation), none below `min_prob`. Without `branch`, a chain: only the most frequent
    child at each node (ties: the first seen)."""
    if not branch:
        return _chain(tree, node, limit, min_prob)
    tokens, parents, score, tie = [], [], 0.0, itertools.count()
    frontier: list = []  # heap of (-probability, tie, token, node, parent index)

    def offer(at: int, reach: float, index: int) -> None:
        children, total = tree.children[at], tree.count[at]
        if not children:
            return
        least = min_prob * total / reach  # a child needs this count to reach min_prob
        if branch:  # a short match's node can have hundreds of children: rank only those that qualify
            ranked = sorted(((t, c) for t, c in children.items() if tree.count[c] >= least),
                            key=lambda item: -tree.count[item[1]])
        else:
            ranked = [max(children.items(), key=lambda item: tree.count[item[1]])]
        for token, child in ranked:
            prob = reach * tree.count[child] / total
            if prob >= min_prob:
                heapq.heappush(frontier, (-prob, next(tie), token, child, index))

    offer(node, 1.0, -1)
    while frontier and len(tokens) < limit:
        prob, _, token, child, parent = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent)
        score -= prob
        offer(child, -prob, len(tokens) - 1)
    return Speculation(tokens, parents, score, node)


def _chain(tree: SuffixTree, node: int, limit: int, min_prob: float) -> Speculation:
    """`grow` without branching: its frontier never holds more than one node, so a walk down the
    most frequent child does the same arithmetic (in the same order) without the heap."""
    children, count = tree.children, tree.count
    tokens, score, reach, at = [], 0.0, 1.0, node
    while len(tokens) < limit and children[at]:
        if len(children[at]) == 1:  # a long match's usual case
            (token, child), = children[at].items()
        else:
            token, child = max(children[at].items(), key=lambda item: count[item[1]])
        prob = reach * count[child] / count[at]
        if prob < min_prob:
            break
        tokens.append(token)
        score += prob
        reach, at = prob, child
    return Speculation(tokens, list(range(-1, len(tokens) - 1)), score, node)


class RequestCache:
    """The global tree: earlier requests' outputs, at most `max_requests` of them and
    `max_tokens` tokens in all (memory: at most max_tokens × depth nodes of NODE_BYTES), the
    least recently used evicted first (used: added, or the source of a draft)."""

    def __init__(self, depth: int, max_requests: int, max_tokens: int):
        self.tree = SuffixTree(depth)
        self.max_requests, self.max_tokens = max_requests, max_tokens
        self.entries: OrderedDict[int, list[int]] = OrderedDict()
        self.tokens = 0
        self.ids = itertools.count()
        self.version = 0  # bumped by every change of the tree: what a row's held suffixes were read at

    def add(self, tokens: list[int], context: int = 0) -> None:
        """An output, after `context` tokens of its prompt (nothing when it is only prompt)."""
        tokens = tokens[-self.max_tokens:] if self.max_tokens else []  # an output longer than the bound keeps its end
        if len(tokens) <= context or self.max_requests == 0:
            return
        entry = next(self.ids)
        self.version += 1
        self.tree.extend(self.tree.start(), tokens, entry)
        self.entries[entry] = tokens
        self.tokens += len(tokens)
        while len(self.entries) > self.max_requests or self.tokens > self.max_tokens:
            _, evicted = self.entries.popitem(last=False)
            self.tree.remove(evicted)
            self.tokens -= len(evicted)

    def touch(self, entry: int) -> None:
        if entry in self.entries:
            self.entries.move_to_end(entry)

    def bytes(self) -> int:
        return self.tree.nodes * NODE_BYTES


@dataclass
class _Local:
    """One request's tree over its prompt and output, and how far it has read them."""

    tree: SuffixTree
    open: list[int]
    seen: int  # committed tokens in the tree
    prompt_len: int
    held: list[int] | None = None  # the text's suffixes in the global tree (`SuffixTree.follow`)
    held_at: int = -1  # the global tree's version they were read at


class SuffixProposer(RowProposer):
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

    def propose_row(self, row: int, rows: Rows, gamma: int) -> DraftBlock | DraftTree | None:
        return self._use(self._speculate(row, rows.tokens[row], gamma, rows.trees))

    def lookup(self, committed: list[int], gamma: int, row: int, trees: bool = False) -> DraftBlock | DraftTree | None:
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

    def _use(self, speculation: Speculation) -> DraftBlock | DraftTree | None:
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


def _draft(speculation: Speculation) -> DraftBlock | DraftTree | None:
    if not speculation.tokens:
        return None
    tokens = torch.tensor(speculation.tokens, dtype=torch.long)  # [N]
    if all(parent == i - 1 for i, parent in enumerate(speculation.parents)):
        return DraftBlock(tokens)  # a chain needs no tree mask
    return DraftTree(tokens, tuple(speculation.parents))


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
