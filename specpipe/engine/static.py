"""`graphs=on`: the native engine's static step, every decode forward in one of a few fixed shapes.

A forward of [B, n] tokens (a plain step or a verify block) runs as a [bucket, K] block over
persistent buffers: B padded to a batch bucket (1, 2, 4, 8, ...), n to a block size within the
runner's plan (`plan`: 1 + the widest γ its pipeline's controller can pick, or its proposer's
largest tree; wider blocks, such as a prompt fed through `forward`, run the eager forward).
Attention runs over a fixed width of the cache's slots through a mask built on the device from
the rows' lengths (a device tensor the host fills each step), so no shape depends on a length
(gpt-fast; vLLM's uniform decode). The width is a bucket (`widths`: 256, 512, 1024, ... slots,
and the whole allocation) of what the rows will hold: their requests' prompts and budgets where
the runner was told them (`Runner.expect`), else their lengths after the block. A request's
steps then all attend over one width, and a short request does not read the keys of a long one's
slots (static caches attending over the whole allocation are what made transformers' StaticCache
slower than its dynamic cache). Keys past a row's position are masked whatever the width, and
the kernels' reductions over them add exact zeros, so a row's result does not depend on the
width (tests/test_static.py checks it bitwise). On CUDA each shape is captured once as a CUDA
graph (graphs.py) and replayed: a step copies its ids and lengths into the buffers (one copy
from pinned memory) and launches one graph. A forward's `Tail` (the greedy or rejection verdict,
a draft model's pick) runs inside the graph after the logits, reading its inputs (a sampling
verdict's draws) from buffers of its own, and only its output leaves it. On the CPU the same
code runs eagerly: what the tests check there.

Two block policies (`kernels=`):
- exact: ONE shape per pipeline, [the bucket of the cache's rows, K], for plain steps and verify
  blocks alike, each token at the block row of its position mod K (the block is a ring). A
  token's row is then computed by the same kernels, at the same row index, over the same visible
  keys, whether a plain step or a verify block computes it: a verify row is bitwise its plain
  step's row by construction, for every precision whose rows do not read each other (all but
  int8's one activation scale per call). Kernels may differ by row count (cuBLAS, oneDNN) and
  even by row index (MKL splits small row counts unevenly between threads): neither changes.
  The cost: every step computes bucket · K rows. A tree's siblings share a position, so they
  cannot each sit at their position's row: the runner takes chains only (`trees` is False).
- fast: the fewest rows: a plain step is one row, a verify block its size padded to a power
  of two (at most K), the batch to the bucket of its rows. Within tolerance, trees included.

Padding rows (past a row's block, or batch rows past B) compute values nothing reads; they
write keys at their row's slots past its length, which no real row sees (and the next step
overwrites), so the cache keeps `SPARE` slots past its capacity for them. Every padding row
sees its own slot, so none divides by an empty softmax (a NaN key, even masked, would poison
the rows that attend over it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial

import torch

from specpipe.drafts import block_ancestry, block_depths
from specpipe.engine.base import Split, Tail, TailInputs, TargetOutput
from specpipe.engine.graphs import Graphs
from specpipe.engine.native_attention import KVCache, _mask, key_positions
from specpipe.engine.native_model import NativeLM

MAX_BLOCK = 32  # the widest block a plan may ask for (blocks wider than the plan run the eager forward)
SPARE = MAX_BLOCK  # slots past a cache's capacity for padding rows (a block writes < MAX_BLOCK past a length)
ALIGN = 64  # slots allocated per row, rounded up to this (aligned rows for the GPU's attention kernels)
WIDTH_MIN = 256  # the narrowest attention width (a multiple of ALIGN)


@dataclass(frozen=True)
class Shape:
    """One static step: a CUDA graph on a GPU."""

    bucket: int  # batch rows computed
    block: int  # K: tokens per row
    tree: bool  # rows laid out by a tree's parents (else a chain)
    hidden: tuple[int, ...]  # hidden-state keys returned
    tail: str | None = None  # the `Tail` computed inside (its name), whose output replaces the logits
    width: int = 0  # cache slots attended over (`widths`)

    @property
    def inputs(self) -> "Shape":
        """The shape whose buffers this one's graph reads: every width of a shape shares them."""
        return replace(self, width=0)


def bucket_of(rows: int) -> int:
    """The batch bucket of `rows` rows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


@cache
def widths(full: int) -> tuple[int, ...]:
    """The attention widths a static step runs at over a cache of `full` slots a row: powers of
    two from `WIDTH_MIN` below it, then `full` itself (once per cache: every step asks)."""
    out, width = [], WIDTH_MIN
    while width < full:
        out.append(width)
        width *= 2
    return (*out, full)


def width_of(needed: int, full: int) -> int:
    """The narrowest width that holds `needed` slots (`full` at most)."""
    return next(width for width in widths(full) if width >= min(needed, full))


def spare_slots(capacity: int) -> int:
    """Slots a static cache allocates past `capacity` (at least SPARE, the row aligned)."""
    return SPARE + (-(capacity + SPARE) % ALIGN)


class _Meta:
    """Views of one shape's inputs packed in one tensor: the rows' lengths [bucket], a tail's
    counts [bucket], the block's ids [bucket, K]."""

    def __init__(self, packed: torch.Tensor, bucket: int, block: int):
        lengths, counts, ids = packed.split((bucket, bucket, bucket * block))
        self.lengths, self.counts, self.ids = lengths, counts, ids.view(bucket, block)

    @staticmethod
    def size(bucket: int, block: int) -> int:
        return 2 * bucket + bucket * block


class _Buffers:
    """The persistent inputs (and, on CUDA, outputs) of one shape. Its inputs sit in one tensor
    (`_Meta`), so a step writes what the host holds of them (the lengths, and the ids and
    counts where they were made on the host) into its pinned host copy and makes ONE
    host-to-device copy; what is on the device already (ids from the last verdict or a head's
    draft, a draft's counts) is copied in after it, on the device. A tree shape also keeps each
    row's block depths [bucket, K] and ancestry [bucket, K, K] on the device, built there from
    the draft's parents (`drafts.block_depths`, `block_ancestry`): no read. On CUDA two pinned
    copies alternate, so a fill waits for the copy two fills back, not the last: a draft
    model's steps, queued with no read between them, then keep the host a step ahead."""

    def __init__(self, shape: Shape, cache: KVCache, device: torch.device, sizes: tuple[tuple[int, ...], ...] = ()):
        bucket, block = shape.bucket, shape.block
        cuda = device.type == "cuda"
        hosts = [torch.zeros(_Meta.size(bucket, block), dtype=torch.long, pin_memory=cuda) for _ in range(1 + cuda)]
        self.packed = hosts[0].to(device) if device.type != "cpu" else hosts[0]
        self.meta = _Meta(self.packed, bucket, block)
        self._hosts = [(host, _Meta(host, bucket, block)) for host in hosts]
        self._copied = [torch.cuda.Event() for _ in hosts] if cuda else None  # each host copy's last copy is done
        self._turn = 0  # the host copy the next fill writes
        self.caches = [t[:bucket] for t in cache.layers]  # views: the cache's own storage
        # a tail's inputs (`TailInputs`), [bucket, *size] each; ones: a race's draws divide by them
        self.extras = [torch.ones((bucket, *size), device=device) for size in sizes]
        if shape.tree:  # padding rows (past a row's block, or past B): their own slot, at their own position
            self.depths = torch.arange(block, device=device).repeat(bucket, 1)  # [bucket, K]
            self.seen = torch.eye(block, dtype=torch.bool, device=device).repeat(bucket, 1, 1)  # [bucket, K, K]

    def fill(self, shape: Shape, ids: torch.Tensor | Split, lengths: list[int], tree: torch.Tensor | None,
             counts: list[int] | torch.Tensor | None = None, inputs: TailInputs | None = None) -> None:
        """ids [B, n] (on the host, the device, or a `Split` of both), the cache rows' lengths, a
        tree's parents [B, n - 1] (where the draft is), a tail's counts [B] and inputs (written
        into `extras`). Columns past n and rows past B keep old ids: padding."""
        batch, n = ids.shape
        bucket = shape.bucket
        host, staged = self._hosts[self._turn]
        if self._copied is not None:
            self._copied[self._turn].synchronize()  # its copy two fills back (done long ago in a decode loop)
        made, rest = _parts(ids)
        made_n = 0 if made is None else made.shape[1]  # columns the host made
        staged.lengths.copy_(torch.tensor(lengths[:bucket]))
        if made is not None:
            staged.ids[:batch, :made_n] = made
        if isinstance(counts, list):
            staged.counts.copy_(torch.tensor(counts + [0] * (bucket - len(counts))))
        if self._copied is not None:
            self.packed.copy_(host, non_blocking=True)
            self._copied[self._turn].record()
            self._turn = 1 - self._turn
        if rest is not None:  # after the host's copy (stream order)
            self.meta.ids[:batch, made_n:n].copy_(rest)
        if isinstance(counts, torch.Tensor):  # rows past B are not read
            self.meta.counts[:batch].copy_(counts)
        if inputs is not None:  # none at a capture: the buffers keep their values
            inputs.fill(self.extras)
        if shape.tree:
            self._fill_tree(tree, batch, n)

    def _fill_tree(self, tree: torch.Tensor | None, batch: int, n: int) -> None:
        """A tree's rows laid out by its parents, on the device; the rest as padding rows."""
        block = self.depths.shape[1]
        self.depths.copy_(torch.arange(block, device=self.depths.device).expand_as(self.depths))
        self.seen.copy_(torch.eye(block, dtype=torch.bool, device=self.seen.device).expand_as(self.seen))
        if tree is not None and tree.shape[1] > 0:
            self.depths[:batch, :n] = block_depths(tree).to(self.depths.device, non_blocking=True)
            self.seen[:batch, :n, :n] = block_ancestry(tree).to(self.seen.device, non_blocking=True)


class StaticStep:
    """The static forward of one `NativeLM` over one `KVCache` (`bind` a new one after growing it)."""

    def __init__(self, lm: NativeLM, exact: bool):
        self.lm, self.exact = lm, exact
        self.ring = exact  # each chain token at the block row of its position mod K (exact's construction)
        self.graphs = Graphs(lm.device)  # CUDA graphs by shape; the CPU runs the same code eagerly
        self.block = 1  # K: the widest block planned
        self.cache: KVCache | None = None
        self.shapes: set[Shape] = set()  # every shape a forward ran
        self._buffers: dict[Shape, _Buffers] = {}
        self._warm: set[tuple] = set()  # (hidden-state keys, tail name, width) whose planned shapes are captured
        self._tails: dict[str, Callable] = {}  # a tail's computation, by its name

    @property
    def capture(self) -> bool:
        """Whether shapes are captured as CUDA graphs (on a GPU)."""
        return self.graphs.capture

    @property
    def captures(self) -> int:
        """CUDA graphs captured (0 on the CPU)."""
        return self.graphs.captures

    def bind(self, cache: KVCache) -> None:
        """A new cache: buffers and graphs hold the old one's storage, so they go."""
        self.cache = cache
        self._buffers.clear()
        self.graphs.clear()
        self._warm.clear()

    def plan(self, block: int) -> None:
        self.block = max(self.block, min(block, MAX_BLOCK))
        self._warm.clear()  # new shapes to capture

    def blocks(self) -> list[int]:
        """The block sizes a forward pads to: K alone (exact), or powers of two below K and K (fast)."""
        return [self.block] if self.exact else sorted({min(bucket_of(n), self.block) for n in range(1, self.block + 1)})

    def planned(self, hidden: tuple[int, ...], tail: str | None = None, width: int | None = None) -> list[Shape]:
        """Every shape a forward asking for `hidden` (and a chain's `tail`) runs as at `width`
        (None: the whole allocation), within the plan (what a GPU captures at the first such
        forward): exact, one; fast, every bucket up to the cache's rows by every block, and the
        tree blocks of one sequence (no tail: a tree is verified from its logits; a batch's tree
        shape is captured at its first forward)."""
        width = self.cache.width if width is None else width
        if self.exact:
            return [Shape(self.cache.batch, self.block, False, hidden, tail, width)]
        buckets = [1 << i for i in range(self.cache.batch.bit_length())]
        return ([Shape(bucket, block, False, hidden, tail, width) for bucket in buckets for block in self.blocks()]
                + [Shape(1, block, True, hidden, None, width) for block in self.blocks() if block > 1])

    def shape(self, batch: int, n: int, tree: torch.Tensor | None, hidden: tuple[int, ...],
              tail: Tail | None = None, needed: int = 0) -> Shape | None:
        """The shape a forward of [batch, n] runs as, attending over the narrowest width that
        holds `needed` slots a row, or None: a block wider than planned (a prompt fed through
        `forward`) runs the eager forward, so no unplanned shape is made. A tree's shape runs no
        tail."""
        if n > self.block:
            return None
        name = None if tail is None or tree is not None else tail.name
        width = width_of(needed, self.cache.width)
        if self.exact:
            return Shape(self.cache.batch, self.block, tree is not None, tuple(hidden), name, width)
        return Shape(bucket_of(batch), min(bucket_of(n), self.block), tree is not None, tuple(hidden), name, width)

    @torch.inference_mode()
    def forward(self, shape: Shape, ids: torch.Tensor | Split, lengths: list[int], tree: torch.Tensor | None,
                tail: Tail | None = None) -> TargetOutput:
        """ids [B, n] at the rows' `lengths` (host ints, every cache row's) -> logits [B, n, V]
        and {key: [B, n, H]}, as the eager forward returns them; where the shape runs `tail`,
        its output [B, C] instead of the logits."""
        tail = tail if shape.tail is not None else None  # a tree's shape runs none
        if tail is not None:
            self._tails.setdefault(shape.tail, tail.compute)
        if self.capture and shape not in self.graphs and (shape.hidden, shape.tail, shape.width) not in self._warm:
            self._capture_planned(shape.hidden, tail, lengths, shape.width)
        buffers = self._buffers_of(shape, tail)
        buffers.fill(shape, ids, lengths, tree, None if tail is None else tail.counts,
                     None if tail is None else tail.inputs)
        self.shapes.add(shape)
        batch, n = ids.shape
        # a planned shape replays; an unplanned tree is captured now
        logits, hidden, out = self.graphs.run(shape, partial(self._compute, shape, buffers))
        hidden = {key: self._kept(value[:batch, :n]) for key, value in hidden.items()}
        if out is not None:  # nothing reads the logits: left in the graph
            return TargetOutput(None, hidden, self._kept(out[:batch]))
        return TargetOutput(self._kept(logits[:batch, :n]), hidden)

    def _kept(self, t: torch.Tensor) -> torch.Tensor:
        """An output the caller keeps: on a GPU a copy of the graph's own memory, which its next
        replay rewrites; on the CPU (no graph) the tensor itself."""
        return t.clone() if self.capture else t

    def _buffers_of(self, shape: Shape, tail: Tail | None) -> _Buffers:
        """The buffers of `shape`'s inputs, one set for all its widths."""
        buffers = self._buffers.get(shape.inputs)
        if buffers is None:
            sizes = () if tail is None or tail.inputs is None else tail.inputs.sizes(shape.block, self.lm.vocab_size)
            buffers = self._buffers[shape.inputs] = _Buffers(shape, self.cache, self.lm.device, sizes)
        return buffers

    def _capture_planned(self, hidden: tuple[int, ...], tail: Tail | None, lengths: list[int], width: int) -> None:
        """Capture every planned shape at `width` not captured yet, on padding inputs: a token 0
        at each row's length (writing only slots past the rows' lengths), a tree block of padding
        rows, counts 0, a tail's inputs as their buffers hold them. A width is captured at the
        first forward that runs at it (a request longer than any before: its first step)."""
        pad = torch.zeros(1, 1, dtype=torch.long, device=self.lm.device)
        name = None if tail is None else tail.name
        for shape in self.planned(hidden, name, width):
            if shape not in self.graphs:
                buffers = self._buffers_of(shape, tail if shape.tail else None)
                buffers.fill(shape, pad, lengths, None, [0] if shape.tail else None)
                self.graphs.ensure(shape, partial(self._compute, shape, buffers))
        self._warm.add((hidden, name, width))

    def _compute(self, shape: Shape, buffers: _Buffers) -> tuple[torch.Tensor | None, dict[int, torch.Tensor],
                                                                 torch.Tensor | None]:
        """The step, on the buffers alone (what a graph captures: no host reads, no new shapes)
        -> (logits [bucket, K, V], {key: [bucket, K, H]}, None), or with a tail (None, hidden,
        its output [bucket, C])."""
        lm, bucket, block, width = self.lm, shape.bucket, shape.block, shape.width
        meta = buffers.meta
        device = meta.ids.device
        starts = meta.lengths[:, None]  # [bucket, 1]: each row's length, its block's first slot
        rows = torch.arange(block, device=device)
        ring = self.ring and not shape.tree
        keys = None  # each slot's key position (None: the slot's own, as in a chain)
        if shape.tree:
            positions = starts + buffers.depths  # [bucket, K]: start + depth
            slots = starts + rows  # a tree's rows sit in block order
            mask = _mask(starts[:, 0], block, width, buffers.seen)  # [bucket, 1, K, width]
            if any(window is not None for window in lm.windows):
                keys = key_positions(starts[:, 0], buffers.depths, width)
            ids = meta.ids
        else:
            # [bucket, K]: the token each block row holds
            order = (rows - starts) % block if ring else rows.expand(bucket, block)
            positions = slots = starts + order
            mask = (torch.arange(width, device=device) <= positions[..., None])[:, None]  # causal, by position
            ids = meta.ids.gather(1, order)
        x, hidden = lm.decode(ids, positions, slots, mask, keys, buffers.caches, shape.hidden)  # the eager body
        logits = lm.logits(x).view(bucket, block, -1)
        if ring:  # back to block order: token j of row b sits at ring row (start + j) mod K
            back = (rows + starts) % block
            logits, hidden = _take(logits, back), {key: _take(value, back) for key, value in hidden.items()}
        if shape.tail is not None:
            return None, hidden, self._tails[shape.tail](logits, meta.ids, meta.counts, *buffers.extras)
        return logits, hidden, None


def _parts(ids: torch.Tensor | Split) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the columns the host made, the columns after them on the device), either None."""
    if isinstance(ids, Split):
        return ids.host, ids.device
    return (ids, None) if ids.device.type == "cpu" else (None, ids)


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, K, D] gathered along K by index [B, K]."""
    return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))
