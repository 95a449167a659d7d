"""An EAGLE head's drafting over a batch of rows, one body run eagerly or as CUDA graphs: the
feed of the committed rows, a chain (greedy or sampled) and EAGLE-2's tree search.

Every drafting row of a step goes through one head forward per draft depth (as vLLM's
`EagleProposer.propose`): the head's `SlotCache` holds every row's keys and values [rows, kv
heads, capacity, head dim], and each row writes its head rows at its own slots and attends
through a mask [A, n, width] over the first `width` slots. The committed rows a verdict kept
(1..γ+1 a row, or a prompt's backlog) are fed in one forward too, padded to the longest: a
row's padding is written past its committed rows, where the chain's rows overwrite it.

The bodies here take tensors only (no host read but the CPU's chain early stop, no shape that
depends on a value), so the same function runs eagerly and inside `Graphs.run`. Eagerly the
attended width is exactly what the longest row needs at each depth, and one row needs no mask
(its width ends at its own slot), so the CPU computes what a row's own pass would. Where the
target's steps are graphed (`Runner.graphed`: CUDA graphs on a GPU; on the CPU `Graphs.run`
computes without capture, which the tests check) `HeadGraphs` runs them over persistent
buffers, refilled in place before each replay, at the narrowest width of `static.widths` that
holds the draft's last slot (a graph per width, captured when the rows first reach it): on a
GPU a chain of γ tokens is some hundred small kernels, which launched one by one cost more
than the head computes. A feed of more than `FEED_MAX` rows (a prompt's) and a draft of
`MAX_BLOCK` or more run eagerly over the same slots. A sampled chain samples from race draws
made before the replay (`sampling.StepRandom`: one launch for the rows on the run's stream, one
per row with a seed of its own): host-seeded generators, which a graph cannot reseed, so the
draws go into a buffer the graph reads, the numbers the eager chain draws. A tree's shape is read back after it, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.engine.graphs import Graphs
from specpipe.engine.static import MAX_BLOCK, width_of
from specpipe.heads.eagle import SlotCache
from specpipe.proposers.eagle_tree import search
from specpipe.sampling import race

FEED_MAX = 16  # committed rows a graphed feed takes a row (more, a prompt's or a long pause's: fed eagerly)

# (features [A, n, H], tokens [A, n], positions [A, n], cache, mask [A, n, width] or None) -> next features [A, n, H]
Feed = Callable[..., torch.Tensor]
# (features [..., H], k) -> (log-probabilities [..., k], token ids [..., k]) of the draft LM's k best
Top = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Sampled:
    """A sampled chain's two halves: `probs` (head outputs [A, H] -> the draft's distributions
    [A, V], float32) and `draw` ((position i, out [A, V]) -> out filled with each drafting
    row's race draws for position i, from its own generator); V = `size`."""

    probs: Callable[[torch.Tensor], torch.Tensor]
    draw: Callable[[int, torch.Tensor], torch.Tensor]
    size: int


@dataclass(frozen=True)
class CacheRows:
    """The cache rows that draft: `index` [A] on the device, `first` (host) where they are rows
    0..A-1 (read as views of the cache, no gather)."""

    index: torch.Tensor
    first: bool


def feed_rows(feed: Feed, cache: SlotCache, rows: CacheRows, features: torch.Tensor, tokens: torch.Tensor,
              fed: torch.Tensor, counts: torch.Tensor | None, width: int, masked: bool) -> torch.Tensor:
    """Committed rows (features [A, n, H], tokens [A, n]) written at slots fed + [0, n) of each row
    (fed [A]), each attending over the row's slots up to its own -> the head's guess after each
    row's last real one [A, H] (counts [A]: real rows a row, the rest padding; None: all n).
    masked: build the mask (rows of different starts or lengths); else one causal block."""
    n = tokens.shape[1]
    slots = fed[:, None] + torch.arange(n, device=fed.device)  # [A, n] each row's slots and positions
    mask = _mask(slots, width) if masked else None
    guesses = feed(features, tokens, slots, cache.at(rows.index, rows.first, slots, width), mask)  # [A, n, H]
    if counts is None:
        return guesses[:, -1]
    return guesses[torch.arange(len(counts), device=counts.device), counts - 1]


def chain(feed: Feed, top: Top, cache: SlotCache, rows: CacheRows, root: torch.Tensor, start: torch.Tensor,
          gamma: int, widths: list[int], stops, limits: torch.Tensor | None, sampled: Sampled | None,
          draws: Callable[[int], torch.Tensor] | None, masked: bool, stop_early: bool) -> tuple[torch.Tensor, ...]:
    """Each row's chain of up to γ tokens from its root [A, H]: token i is fed back as a head row
    at slot start + i (start [A]), attending over widths[i] slots. stops: per position, the
    confidence below which a row stops (host floats or a device tensor); limits [A]: each row's
    γ (None: every row the full length); draws(i) [A, V]: position i's race draws (sampled).
    stop_early (the CPU's eager chain): stop once no row drafts on, read where a stop is set.
    -> (tokens [A, W], distributions [A, W, V] or None, confidence [A, W], tokens counted [A])."""
    device = root.device
    hidden = root
    alive = torch.ones(len(root), dtype=torch.bool, device=device)
    count = torch.zeros(len(root), dtype=torch.long, device=device)  # tokens drafted before a stop
    tokens, probs, confidence = [], [], []
    for i in range(gamma):
        if sampled is None:
            logp, ids = top(hidden, 1)  # [A, 1]
            token, best = ids[:, 0], logp[:, 0].exp()
        else:
            probs.append(sampled.probs(hidden))  # [A, V] float32, the target's transform
            token, best = race(probs[-1], draws(i)), probs[-1].max(-1).values
        tokens.append(token)
        confidence.append(best)
        count += alive.long()
        alive &= ~(best < stops[i])  # a stop: later tokens are not counted
        if limits is not None:
            alive &= i + 1 < limits
        if i + 1 == gamma or (stop_early and _reads(stops[i]) and not bool(alive.any())):
            break  # the controller's call: γ logic stays out of the proposer
        slot = (start + i)[:, None]  # [A, 1] each row's slot and position
        width = widths[i]
        mask = _mask(slot, width) if masked else None  # every committed row and the chain so far
        hidden = feed(hidden[:, None], token[:, None], slot, cache.at(rows.index, rows.first, slot, width), mask)[:, 0]
    return torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None, torch.stack(confidence, 1), count


def _mask(slots: torch.Tensor, width: int) -> torch.Tensor:
    """[A, n, width] bool: each row's head row at slots [A, n] sees its row's slots up to its own."""
    return torch.arange(width, device=slots.device) <= slots[..., None]


def _reads(stop) -> bool:
    """Whether a stop is set at this position (host floats only: the eager chain)."""
    return not isinstance(stop, torch.Tensor) and stop > 0


class _Inputs:
    """The persistent inputs of `count` drafting rows, refilled in place before each feed and draft."""

    def __init__(self, device: torch.device, count: int):
        self.index = torch.zeros(count, dtype=torch.long, device=device)  # [A] the cache rows
        self.index_at: tuple[int, ...] | None = None  # what `index` holds (host)
        self.features: torch.Tensor | None = None  # [A, FEED_MAX, H] committed rows to feed (at the first feed)
        self.tokens = torch.zeros(count, FEED_MAX, dtype=torch.long, device=device)  # [A, FEED_MAX]
        self.fed = torch.zeros(count, dtype=torch.long, device=device)  # [A] each row's first fed slot
        self.counts = torch.ones(count, dtype=torch.long, device=device)  # [A] real rows fed a row
        self.root: torch.Tensor | None = None  # [A, H] the draft's roots, in the head's dtype
        self.start = torch.zeros(count, dtype=torch.long, device=device)  # [A] each row's first draft slot
        self.start_at: tuple[int, ...] | None = None  # what `start` holds (host), so a feed's graph may set it
        self.thresholds = torch.zeros(MAX_BLOCK, device=device)  # [MAX_BLOCK] stop below, per position
        self.stops: list[float] = []  # the thresholds last copied in (host)
        self.limits = torch.zeros(count, dtype=torch.long, device=device)  # [A] each row's γ
        self.limits_at: tuple[int, ...] | None = None
        self.draws: dict[int, torch.Tensor] = {}  # a sampled chain's race draws [A, γ, V], by γ


class HeadGraphs:
    """A proposer's feeds and drafts as graphs over its head cache (`cache`, which the graphs
    write into: one for the proposer's life), keyed by the drafting rows' count and the width."""

    def __init__(self, device: torch.device, cache: SlotCache):
        self.graphs = Graphs(device)
        self.cache = cache
        self._caches = {"rows": cache}  # the head caches the graphs write into, by name: one, every row's
        self._grown = cache.grown  # the cache's growth the graphs were captured over
        self._inputs: dict[tuple[int, bool], _Inputs] = {}

    @property
    def captures(self) -> int:
        return self.graphs.captures

    @staticmethod
    def feeds(rows: int) -> bool:
        """Whether `rows` committed rows a row are fed as a graph (more: eagerly)."""
        return rows <= FEED_MAX

    @staticmethod
    def takes(gamma: int) -> bool:
        """Whether a draft of γ (a tree's depth) fits the slots past a row's cache (wider: eager,
        and grows the slots where it passes them)."""
        return gamma < MAX_BLOCK

    def feed(self, index: list[int], features: torch.Tensor, tokens: torch.Tensor, fed: list[int],
             counts: list[int], feed: Feed) -> torch.Tensor:
        """The committed rows (features [A, n, H], tokens [A, n], counts[a] of them real) of cache
        rows `index`, fed at slots fed[a] + [0, n) -> the roots [A, H] (the inputs' buffer, which
        the next feed rewrites); the draft's first slots are set on the device."""
        n = tokens.shape[1]
        inputs = self._inputs_of(index)
        if inputs.features is None:
            inputs.features = features.new_zeros(len(index), FEED_MAX, features.shape[-1])
        inputs.features[:, :n].copy_(features)
        inputs.tokens[:, :n].copy_(tokens)
        _refill(inputs.fed, fed)
        ragged = min(counts) < n
        if ragged:
            _refill(inputs.counts, counts)
        width = width_of(max(fed) + n, self.cache.capacity)
        rows = CacheRows(inputs.index, index == list(range(len(index))))
        compute = lambda: self._feed(inputs, rows, n, ragged, feed, width)  # noqa: E731
        self.graphs.run(("feed", len(index), rows.first, n, ragged, width), compute)
        inputs.start_at = tuple(f + c for f, c in zip(fed, counts))  # the graph set the draft's first slots
        return inputs.root

    def chain(self, index: list[int], root: torch.Tensor, starts: list[int], gammas: list[int], stops: list[float],
              feed: Feed, top: Top, sampled: Sampled | None = None) -> tuple[torch.Tensor, ...]:
        """`chain` of max(gammas) tokens from the roots [A, H] of cache rows `index`, first rows at
        slots `starts`, over one width: every position is drafted (a GPU would wait on the host
        to learn that all rows stopped) -> `chain`'s outputs, the graph's memory: read before
        the next replay."""
        gamma = max(gammas)
        inputs = self._refill(index, root, starts)
        if stops != inputs.stops[:gamma]:  # the controller's early stop: the same step after step
            inputs.thresholds[:gamma].copy_(torch.tensor(stops), non_blocking=True)
            inputs.stops = list(stops)
        limited = min(gammas) < gamma
        if limited and tuple(gammas) != inputs.limits_at:
            _refill(inputs.limits, gammas)
            inputs.limits_at = tuple(gammas)
        draws = None
        if sampled is not None:
            draws = inputs.draws.get(gamma)
            if draws is None:
                draws = inputs.draws[gamma] = root.new_empty(len(index), gamma, sampled.size, dtype=torch.float32)
            for i in range(gamma):
                sampled.draw(i, draws[:, i])
        width = width_of(max(starts) + gamma, self.cache.capacity)  # rows at start .. start + γ - 2
        rows = CacheRows(inputs.index, index == list(range(len(index))))
        limits = inputs.limits if limited else None
        drawn = None if draws is None else lambda i: draws[:, i]  # noqa: E731
        compute = lambda: chain(feed, top, self.cache, rows, inputs.root, inputs.start, gamma,  # noqa: E731
                                [width] * gamma, inputs.thresholds, limits, sampled, drawn, True, False)
        return self.graphs.run(("chain", len(index), rows.first, gamma, limited, sampled is not None, width), compute)

    def tree(self, index: list[int], root: torch.Tensor, starts: list[int], k: int, depth: int, feed: Feed,
             top: Top) -> tuple[torch.Tensor, ...]:
        """`eagle_tree.search` to `depth` from the roots [A, H] of cache rows `index`, first rows at
        slots `starts`, over one width: every depth is searched (a GPU would wait on the host to
        learn that it could stop) -> its nodes, the graph's memory: read before the next replay."""
        inputs = self._refill(index, root, starts)
        width = width_of(max(starts) + depth * k, self.cache.capacity)
        rows = CacheRows(inputs.index, index == list(range(len(index))))
        compute = lambda: search(feed, top, self.cache, rows, inputs.root, inputs.start, k,  # noqa: E731
                                 [width] * (depth - 1))
        return self.graphs.run(("tree", len(index), rows.first, k, depth, width), compute)

    def _inputs_of(self, index: list[int]) -> _Inputs:
        if self.cache.grown != self._grown:  # the slots are new buffers: capture again
            self.graphs.clear()
            self._grown = self.cache.grown
        key = (len(index), index == list(range(len(index))))
        inputs = self._inputs.get(key)
        if inputs is None:
            inputs = self._inputs[key] = _Inputs(self.graphs.device, len(index))
        if inputs.index_at != tuple(index):
            _refill(inputs.index, index)
            inputs.index_at = tuple(index)
        return inputs

    def _refill(self, index: list[int], root: torch.Tensor, starts: list[int]) -> _Inputs:
        """The draft's inputs: its roots and first slots, each copied in unless a feed's graph
        left them there."""
        inputs = self._inputs_of(index)
        if inputs.root is None:
            inputs.root = torch.zeros_like(root)
        if root is not inputs.root:
            inputs.root.copy_(root)
        if inputs.start_at != tuple(starts):
            _refill(inputs.start, starts)
            inputs.start_at = tuple(starts)
        return inputs

    def _feed(self, inputs: _Inputs, rows: CacheRows, n: int, ragged: bool, feed: Feed, width: int) -> None:
        """What a feed's graph captures: `feed_rows` over the inputs, its roots and the draft's
        first slots written into the draft's inputs (a capture's warm-up and its replay write
        the same)."""
        counts = inputs.counts if ragged else None
        guess = feed_rows(feed, self.cache, rows, inputs.features[:, :n], inputs.tokens[:, :n], inputs.fed, counts,
                          width, True)
        if inputs.root is None:  # the first capture: the roots' buffer in the head's dtype
            inputs.root = torch.zeros_like(guess)
        inputs.root.copy_(guess)
        inputs.start.copy_(inputs.fed + (inputs.counts if ragged else n))


def _refill(buffer: torch.Tensor, values: list[int]) -> None:
    buffer.copy_(torch.tensor(values), non_blocking=True)
