"""An EAGLE head's step as CUDA graphs: the feed of the rows a verdict kept, one graph per
(row, rows kept), then the draft, one per (row, γ): a chain, or EAGLE-2's tree search (SGLang
captures its draft loop the same way).

Where the target's steps are graphed (`Runner.graphed`), an EAGLE or EAGLE-3 chain of γ tokens
is γ head forwards and γ top-1s of the draft LM, a tree of depth γ as many block forwards and
top-ks: on a GPU some hundred small kernels, which launched one by one cost more than the head
computes. `HeadGraphs` runs a whole draft as one graph over persistent buffers: the root feature
[H] (the guess of the last committed token's feature), the draft's first slot (a device scalar)
and a chain's early-stop thresholds [γ]. Each head row is written at its slot of the row's
`SlotCache` and attends through a mask built on the device over the narrowest width (256, 512,
... slots, or all of them: `static.widths`) that holds the draft's last slot, so no shape
depends on a length but the width's, and a short request's drafts do not read the whole cache
(each width is a graph of its own, captured when a row's drafts first reach it). The feed before
it writes the committed rows the same way, from buffers of `FEED_MAX` rows (its graph's key is
how many a verdict kept: at most γ + 1; a longer backlog, a prompt's, is fed eagerly). A tree's
shape is read back after the replay, as the eager search reads it. A sampled chain samples
inside its graph from race draws made before the replay (`sampling.race_draws`): each row's
draws come from its own host-seeded generator, which a graph cannot reseed, so the draws go into
a buffer the graph reads, the same numbers the eager chain draws. On the CPU the same code runs
without capture (graphs.py), which is what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.engine.graphs import Graphs
from specpipe.engine.static import MAX_BLOCK, width_of
from specpipe.heads.eagle import SlotCache
from specpipe.proposers.eagle_tree import TreeSearch
from specpipe.sampling import race

FEED_MAX = 16  # committed rows a graphed feed takes (more, a prompt's or a long pause's: fed eagerly)

# (features [n, H], tokens [n], positions [n], cache, mask [1, n, capacity]) -> next features [n, H]
Feed = Callable[..., torch.Tensor]
# (features [..., H], k) -> (log-probabilities [..., k], token ids [..., k]) of the draft LM's k best
Top = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Sampled:
    """A sampled chain's two halves: `probs` (head output [H] -> the draft's distribution [V],
    float32, inside the graph) and `draw` ((position i, out [V]) -> out filled with position
    i's race draws, before the replay); V = `size`."""

    probs: Callable[[torch.Tensor], torch.Tensor]
    draw: Callable[[int, torch.Tensor], torch.Tensor]
    size: int


class _Inputs:
    """One row's persistent inputs, refilled in place before each feed and draft."""

    def __init__(self, device: torch.device):
        self.root: torch.Tensor | None = None  # [H] the draft's root, in the head's dtype (at the first draft)
        self.start = torch.zeros((), dtype=torch.long, device=device)  # the draft's first slot
        self.start_at: int | None = None  # what `start` holds (host), so a feed's graph may set it
        self.thresholds = torch.zeros(MAX_BLOCK, device=device)  # [MAX_BLOCK] stop below, per position
        self.stops: list[float] = []  # the thresholds last copied in (host), so unchanged ones are not copied again
        self.draws: dict[int, torch.Tensor] = {}  # a sampled chain's race draws [γ, V], by γ
        self.features: torch.Tensor | None = None  # [FEED_MAX, H] committed rows to feed (at the first feed)
        self.tokens = torch.zeros(FEED_MAX, dtype=torch.long, device=device)  # [FEED_MAX] their tokens
        self.fed = torch.zeros((), dtype=torch.long, device=device)  # the first one's slot


class HeadGraphs:
    """The feeds and drafts of every row of one proposer, graphed: `cache(row)` is the row's
    head cache (one per row for the proposer's life: the graphs write into it), `feed` the rows
    a verdict kept, `chain` and `tree` drafts."""

    def __init__(self, device: torch.device, capacity: int, top_k: int = 1):
        """capacity: the most positions a row reaches (the target's cache); top_k: a tree's
        children per node (1: chains only)."""
        self.graphs = Graphs(device)
        # a draft writes past its start: a chain γ - 1 rows, a tree k per depth, γ < MAX_BLOCK
        self.capacity = capacity + MAX_BLOCK * top_k
        self._caches: dict[int, SlotCache] = {}
        self._grown: dict[int, int] = {}  # each row cache's growth the graphs were captured over
        self._inputs: dict[int, _Inputs] = {}

    @property
    def captures(self) -> int:
        return self.graphs.captures

    @staticmethod
    def feeds(rows: int) -> bool:
        """Whether `rows` committed rows are fed as a graph (more: eagerly)."""
        return rows <= FEED_MAX

    def feed(self, row: int, features: torch.Tensor, tokens: torch.Tensor, start: int, feed: Feed) -> torch.Tensor:
        """The committed rows (features [n, H], tokens [n]) fed to the row's head at slots start,
        start + 1, ... (the cache's length moves past them) -> the head's guess of the feature
        after the last [H], the draft's root (the row's root buffer, which its next feed rewrites).
        After a verdict the rows are the tokens it kept, so a row has a graph per count kept."""
        n = len(tokens)
        inputs = self._inputs_of(row)
        if inputs.features is None:
            inputs.features = features.new_zeros(FEED_MAX, features.shape[-1])
        inputs.features[:n].copy_(features)
        inputs.tokens[:n].copy_(tokens)
        inputs.fed.fill_(start)
        cache = self._caches[row]
        width = width_of(start + n, cache.capacity)
        self.graphs.run(("feed", row, n, width), lambda: self._feed(inputs, n, cache, feed, width))
        inputs.start_at = start + n  # the feed's graph set the draft's root and first slot: no copies
        cache.filled(start + n)
        return inputs.root

    @staticmethod
    def takes(gamma: int) -> bool:
        """Whether a draft of γ (a tree's depth) fits the slots past a row's cache (wider: eager,
        and grows the slots where it passes them)."""
        return gamma < MAX_BLOCK

    def cache(self, row: int) -> SlotCache:
        """The row's head cache, emptied (a new request)."""
        cache = self._caches.setdefault(row, SlotCache(self.capacity))
        cache.crop(0)
        return cache

    def chain(self, row: int, root: torch.Tensor, start: int, stops: list[float], feed: Feed, top: Top,
              sampled: Sampled | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """The chain of len(stops) tokens from `root` [H], greedy (`sampled` None) or sampled, its
        first row at slot `start` of the row's cache (filled up to it) -> (tokens [γ], the draft's
        distributions [γ, V] (sampled; None: greedy), confidence [γ], tokens drafted before a
        confidence fell below its position's stop []), the graph's memory: read before the next."""
        gamma = len(stops)
        inputs = self._refill(row, root, start)
        if stops != inputs.stops[:gamma]:  # the controller's early stop: the same step after step
            inputs.thresholds[:gamma].copy_(torch.tensor(stops), non_blocking=True)
            inputs.stops = list(stops)
        draws = None
        if sampled is not None:
            draws = inputs.draws.get(gamma)
            if draws is None:
                draws = inputs.draws[gamma] = root.new_empty(gamma, sampled.size, dtype=torch.float32)
            for i in range(gamma):
                sampled.draw(i, draws[i])
        cache = self._caches[row]
        width = width_of(start + gamma, cache.capacity)  # its rows sit at start .. start + γ - 2
        compute = lambda: self._chain(inputs, gamma, cache, feed, top, sampled, draws, width)  # noqa: E731
        return self.graphs.run(("chain", row, gamma, sampled is not None, width), compute)

    def tree(self, row: int, root: torch.Tensor, start: int, k: int, depth: int, feed: Feed,
             top: Top) -> tuple[torch.Tensor, ...]:
        """EAGLE-2's search to `depth` with `k` children a node from `root` [H], its rows from
        slot `start` -> every node made (scores, tokens, parents, depths) [M], for `rerank`
        (the graph's memory: read before the next). Every depth is searched: a GPU would wait
        on the host to learn that the search could stop (the CPU's eager search stops early)."""
        inputs = self._refill(row, root, start)
        cache = self._caches[row]
        width = width_of(start + depth * k, cache.capacity)  # its blocks' rows: start .. start + (depth - 1) · k - 1
        return self.graphs.run(("tree", row, k, depth, width),
                               lambda: self._tree(inputs, k, depth, cache, feed, top, width))

    def _inputs_of(self, row: int) -> _Inputs:
        grown = self._caches[row].grown
        if self._grown.setdefault(row, grown) != grown:  # the row's slots are new buffers: capture again
            self.graphs.clear()
            self._grown = {row: cache.grown for row, cache in self._caches.items()}
        if row not in self._inputs:
            self._inputs[row] = _Inputs(self.graphs.device)
        return self._inputs[row]

    def _refill(self, row: int, root: torch.Tensor, start: int) -> _Inputs:
        """The draft's inputs: its root and first slot, each copied in unless a feed's graph
        left it there."""
        inputs = self._inputs_of(row)
        if inputs.root is None:
            inputs.root = torch.zeros_like(root)
        if root is not inputs.root:
            inputs.root.copy_(root)
        if inputs.start_at != start:
            inputs.start.fill_(start)
            inputs.start_at = start
        return inputs

    @staticmethod
    def _feed(inputs: _Inputs, n: int, cache: SlotCache, feed: Feed, width: int) -> None:
        """What a feed's graph captures: n rows at slots fed + [0, n), each attending over the
        cache's rows before it and itself (within `width` slots); the last row's guess is the
        draft's root, and the slot after the rows its first slot, written into the draft's inputs."""
        device = inputs.tokens.device
        every = torch.arange(width, device=device)  # [width] the slots attended over
        slots = inputs.fed + torch.arange(n, device=device)  # [n] the rows' slots and positions
        mask = (every[None] <= slots[:, None])[None]  # [1, n, width]
        guess = feed(inputs.features[:n], inputs.tokens[:n], slots, cache.at(slots, width), mask)[-1]  # [H]
        if inputs.root is None:  # the first capture: the root's buffer in the head's dtype
            inputs.root = torch.zeros_like(guess)
        # written, not read: a capture's warm-up and the replay after it write the same
        inputs.root.copy_(guess)
        inputs.start.copy_(inputs.fed + n)

    def _chain(self, inputs: _Inputs, gamma: int, cache: SlotCache, feed: Feed, top: Top,
               sampled: Sampled | None, draws: torch.Tensor | None, width: int) -> tuple[torch.Tensor, ...]:
        """What a chain's graph captures: buffers in, no host read, every shape fixed by γ and
        the width attended over."""
        device = inputs.root.device
        hidden = inputs.root  # [H]
        alive = torch.ones((), dtype=torch.bool, device=device)
        count = torch.zeros((), dtype=torch.long, device=device)
        every = torch.arange(width, device=device)  # [width] the slots attended over
        tokens, probs, confidence = [], [], []
        for i in range(gamma):
            if sampled is None:
                logp, ids = top(hidden, 1)
                token, top_p = ids[0], logp[0].exp()
            else:
                probs.append(sampled.probs(hidden))  # [V]
                token, top_p = race(probs[-1], draws[i]), probs[-1].max()
            tokens.append(token)
            confidence.append(top_p)
            count += alive.long()
            alive &= ~(top_p < inputs.thresholds[i])  # a stop: later tokens are not counted
            if i + 1 < gamma:
                slot = (inputs.start + i)[None]  # [1] this row's slot and position
                mask = (every <= slot)[None, None]  # [1, 1, width] every committed row and the chain so far
                hidden = feed(hidden[None], token[None], slot, cache.at(slot, width), mask)[-1]
        return torch.stack(tokens), torch.stack(probs) if probs else None, torch.stack(confidence), count

    def _tree(self, inputs: _Inputs, k: int, depth: int, cache: SlotCache, feed: Feed,
              top: Top, width: int) -> tuple[torch.Tensor, ...]:
        """What a tree's graph captures: the eager search's steps (`EagleProposer._tree`), its
        blocks' rows at slots start + (d - 1)·k + [0, k) and their masks over `width` slots."""
        root = inputs.root
        every = torch.arange(width, device=root.device)  # [width] the slots attended over
        values, ids = top(root, k)  # [k]
        search = TreeSearch(k, depth, root, values, ids)
        for d in range(1, depth):
            best = search.best()
            guesses, tokens = search.fed(best)
            mask = search.slot_mask(best, inputs.start, every)  # [1, k, width]
            slots = inputs.start + (d - 1) * k + torch.arange(k, device=root.device)  # [k]
            positions = (inputs.start + d - 1).expand(k)  # one depth: one position
            hidden = feed(guesses, tokens, positions, cache.at(slots, width), mask)
            search.grow(best, hidden, *top(hidden, k))  # [k, k]
        made = slice(0, search.made)
        return search.scores[made], search.tokens[made], search.parents[made], search.depths[made]
