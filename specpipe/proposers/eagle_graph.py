"""An EAGLE head's greedy draft chain as one CUDA graph per (row, γ) (SGLang's captured draft loop).

Where the target's steps are graphed (`Runner.graphed`), an EAGLE or EAGLE-3 chain of γ tokens
is γ head forwards and γ top-1s of the draft LM: on a GPU some hundred small kernels, which
launched one by one cost more than the head computes. `ChainGraphs` runs the whole chain as one
graph over persistent buffers: the root feature [H] (the guess of the last committed token's
feature), the chain's first slot (a device scalar) and the early-stop thresholds [γ]. Each head
row is written at its slot of the row's `SlotCache` and attends over every slot through a mask
built on the device, so no shape depends on a length. The committed rows are still fed from the
host (a block of any size, rarely twice alike); only the chain, the part repeated every step,
is graphed. Sampled chains stay eager: each row draws from its own host-side generator.
On the CPU the same code runs without capture (graphs.py), which is what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpipe.engine.graphs import Graphs
from specpipe.engine.static import MAX_BLOCK
from specpipe.heads.eagle import SlotCache

# (features [n, H], tokens [n], positions [n], cache, mask [1, n, capacity]) -> next features [n, H]
Feed = Callable[..., torch.Tensor]
# features [H] -> (log-probabilities [1], token ids [1]) of the draft LM's best token
Top = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class _Inputs:
    """One row's persistent inputs, refilled in place before each chain."""

    def __init__(self, root: torch.Tensor):
        self.root = torch.zeros_like(root)  # [H]
        self.start = torch.zeros((), dtype=torch.long, device=root.device)  # the chain's first slot
        self.thresholds = torch.zeros(MAX_BLOCK, device=root.device)  # [MAX_BLOCK] stop below, per position
        self.stops: list[float] = []  # the thresholds last copied in (host), so unchanged ones are not copied again


class ChainGraphs:
    """Greedy chains of every row of one proposer, graphed: `cache(row)` is the row's head cache
    (one per row for the proposer's life: the graphs write into it), `draft` a chain."""

    def __init__(self, device: torch.device, capacity: int):
        """capacity: the most positions a row reaches (the target's cache), chain included."""
        self.graphs = Graphs(device)
        self.capacity = capacity + MAX_BLOCK  # a chain writes up to γ - 1 < MAX_BLOCK slots past its start
        self._caches: dict[int, SlotCache] = {}
        self._inputs: dict[int, _Inputs] = {}

    @property
    def captures(self) -> int:
        return self.graphs.captures

    def cache(self, row: int) -> SlotCache:
        """The row's head cache, emptied (a new request)."""
        cache = self._caches.setdefault(row, SlotCache(self.capacity))
        cache.crop(0)
        return cache

    def draft(self, row: int, root: torch.Tensor, start: int, stops: list[float], feed: Feed,
              top: Top) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The greedy chain of len(stops) tokens from `root` [H], its first row at slot `start`
        of the row's cache (filled up to it) -> (tokens [γ], confidence [γ], tokens drafted before
        a confidence fell below its position's stop []), the graph's memory: read before the next."""
        gamma = len(stops)
        inputs = self._inputs.get(row)
        if inputs is None:
            inputs = self._inputs[row] = _Inputs(root)
        inputs.root.copy_(root)
        inputs.start.fill_(start)
        if stops != inputs.stops[:gamma]:  # the controller's early stop: the same step after step
            inputs.thresholds[:gamma].copy_(torch.tensor(stops), non_blocking=True)
            inputs.stops = list(stops)
        cache = self._caches[row]
        return self.graphs.run((row, gamma), lambda: self._chain(inputs, gamma, cache, feed, top))

    def _chain(self, inputs: _Inputs, gamma: int, cache: SlotCache, feed: Feed,
               top: Top) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the graph captures: buffers in, no host read, every shape fixed by γ."""
        device = inputs.root.device
        hidden = inputs.root  # [H]
        alive = torch.ones((), dtype=torch.bool, device=device)
        count = torch.zeros((), dtype=torch.long, device=device)
        every = torch.arange(self.capacity, device=device)  # [capacity] the cache's slots
        tokens, confidence = [], []
        for i in range(gamma):
            logp, ids = top(hidden)
            tokens.append(ids[0])
            confidence.append(logp[0].exp())
            count += alive.long()
            alive &= ~(confidence[-1] < inputs.thresholds[i])  # a stop: later tokens are not counted
            if i + 1 < gamma:
                slot = (inputs.start + i)[None]  # [1] this row's slot and position
                mask = (every <= slot)[None, None]  # [1, 1, capacity] every committed row and the chain so far
                hidden = feed(hidden[None], ids, slot, cache.at(slot), mask)[-1]
        return torch.stack(tokens), torch.stack(confidence), count
