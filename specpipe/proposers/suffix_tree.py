"""The suffix trees of suffix decoding (proposers/suffix.py): `SuffixTree`, a bounded-depth
tree counting every substring seen, with the open matches that extend it token by token;
`grow`, a draft grown from a node, most probable continuation first; `RequestCache`, the
global tree over earlier requests' outputs, least recently used evicted past its bounds.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass

NODE_BYTES = 200  # one node: its children dict and three list slots (sys.getsizeof, a few children)


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
