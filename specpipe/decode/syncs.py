"""Counting reads back to the host while code runs (a diagnostic, for tests and benchmarks).

The decode step promises one copy to the host a step. On a GPU every read of a tensor's value
from Python (`item`, `tolist`, `bool()`, ...) waits for the device; on the CPU the same call is
free but the same code runs, so counting the Python-level calls while a step runs tells how
many times the step would wait on a GPU. `host_reads` patches `torch.Tensor` for the duration
of its block: use it around a step, never in serving code.

`capture_hazards` goes further, for what a CUDA graph captures: it watches every operation
torch dispatches (a `TorchDispatchMode`) and names those a capturing stream refuses or a replay
would repeat wrongly, which no Python-level count sees: a value read inside an operation (a
boolean mask's indexing, `nonzero`, `unique`), a random draw (a graph replays the captured
generator's state), a tensor made from host data (its values fixed at capture).

`launches` counts, the same way, the operations that would each launch a kernel on a GPU,
where a graphed computation is one launch (its replay): what a step costs the host beyond its
graphs, which on a GPU is ~5-10 µs an operation. On a GPU it counts the operations on device
tensors only (work on host tensors, such as staging a step's inputs in pinned memory, launches
nothing); on the CPU, which cannot tell them apart, every operation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from specpipe.engine.graphs import Graphs

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def host_reads() -> Iterator[list[str]]:
    """Every read of a tensor back to the host while the block runs, by method name."""
    seen: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name, method):
        def read(self, *args, **kwargs):
            seen.append(name)
            return method(self, *args, **kwargs)
        return read

    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(name, method))
    try:
        yield seen
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@contextlib.contextmanager
def capture_hazards() -> Iterator[list[str]]:
    """Every operation while the block runs that a CUDA graph's capture refuses or its replay
    would get wrong, as "op: why" (see the module's docstring)."""
    seen: list[str] = []
    with _Hazards(seen):
        yield seen


class _Hazards(TorchDispatchMode):
    def __init__(self, seen: list[str]):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        why = _hazard(func, args, kwargs or {})
        if why is not None:
            self.seen.append(f"{func}: {why}")
        return func(*args, **(kwargs or {}))


_MASK_INDEXING = {"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"}


def _hazard(func, args, kwargs) -> str | None:
    """Why `func` on `args` cannot be captured or replayed as captured (None: it can)."""
    tags, name = set(func.tags), func._schema.name
    if name in _MASK_INDEXING:  # integer indices are gathers; a boolean mask is a nonzero first
        masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        return "indexes by a boolean mask (its nonzero reads the host)" if masks else None
    if torch.Tag.data_dependent_output in tags or name in ("aten::is_nonzero", "aten::where") and len(args) == 1:
        return "reads a value back to the host"
    if torch.Tag.dynamic_output_shape in tags:
        return "its output's shape depends on values (read from the device)"
    if torch.Tag.nondeterministic_seeded in tags and not _no_dropout(func, args, kwargs):
        return "a random draw (a replay repeats the generator state it captured)"
    if name in ("aten::lift_fresh", "aten::lift_fresh_copy") and args[0].dim() > 0:
        return "a tensor made from host data (a copy to the device, its values fixed at capture)"
    return None


def _no_dropout(func, args, kwargs) -> bool:
    """An attention kernel is tagged random for its dropout: without dropout it draws nothing."""
    names = [a.name for a in func._schema.arguments]
    if "dropout_p" not in names:
        return False
    at = names.index("dropout_p")
    return (args[at] if at < len(args) else kwargs.get("dropout_p", 0.0)) == 0.0


# operations that launch no kernel: allocations, metadata, and the host read (`host_reads`' count)
_NO_KERNEL = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
              "aten::lift_fresh", "aten::_unsafe_view", "aten::detach", "aten::detach_", "aten::alias", "aten::set_",
              "aten::resize_", "aten::_local_scalar_dense", "aten::item"}


@contextlib.contextmanager
def launches(inside: list[str] | None = None, device: torch.device | str = "cpu") -> Iterator[list[str]]:
    """Every operation the block dispatches that would be a kernel launch on a GPU, by name
    (views, allocations and metadata aside); each graphed computation (`Graphs.run`) counts as
    one launch, "graph", whether it is replayed (a GPU) or computed (the CPU). `inside`, if
    given, gets the operations computed inside the graphs: the kernels each replay runs (on the
    CPU only, where the computations run; a GPU's replay dispatches nothing). `device`: the
    step's (not the CPU: host tensors' operations are not counted)."""
    seen: list[str] = []
    watch = _Launches(seen, torch.device(device).type != "cpu")
    run = Graphs.run

    def replayed(graphs, key, compute):
        outer = watch.into
        if outer is seen:  # a graph run inside another graph's computation is a part of it
            seen.append("graph")
            watch.into = inside
        try:
            return run(graphs, key, compute)
        finally:
            watch.into = outer

    Graphs.run = replayed
    try:
        with watch:
            yield seen
    finally:
        Graphs.run = run


class _Launches(TorchDispatchMode):
    def __init__(self, seen: list[str], device_only: bool = False):
        super().__init__()
        self.into: list[str] | None = seen  # where an operation is counted (None: not counted)
        self.device_only = device_only  # count only operations that touch a device tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.into is not None and func._schema.name not in _NO_KERNEL and not _aliases(func, args, out) \
                and not (self.device_only and _on_host(args, kwargs, out)):
            self.into.append(func._schema.name)
        return out


def _on_host(args, kwargs, out) -> bool:
    """Whether every tensor an operation takes and makes is on the host."""
    tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
    return all(t.device.type == "cpu" for t in tensors)


def _aliases(func, args, out) -> bool:
    """Whether `func` returned a view of its input (no kernel). Under `inference_mode` the mode
    sees composite ops whole (`to`, `reshape`, `contiguous`): their schema says "may alias", yet
    they copy whenever the input's dtype or layout asks for it, so the output decides."""
    if not func.is_view:
        return False
    first, result = args[0] if args else None, out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(first, torch.Tensor) or not isinstance(result, torch.Tensor):
        return True
    return result.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()


class StepCount(NamedTuple):
    reads: int  # reads back to the host
    launches: int  # kernel launches outside graphs (a graph's replay is one)
    inside: int  # operations computed inside the step's graphs (on the CPU; 0 where replayed)


def reads_per_step(decoder, requests) -> list[int]:
    """Run `requests` through a `decode.loop.Decoder`, counting the host reads of each step."""
    return [count.reads for count in per_step(decoder, requests)]


def per_step(decoder, requests, counter=None) -> list[StepCount]:
    """Run `requests` through a `decode.loop.Decoder`: each step's host reads, launches outside
    graphs and operations inside them, from its launch to its settling (which an overlapped
    plain step's successor's launch comes between). `counter`: a context manager yielding the
    launches its block makes, in place of `launches` (then nothing is counted inside graphs)."""
    counts: dict[int, list[int]] = {}
    steps = []  # every launched step, in order (kept alive: counts are keyed by identity)
    launch, settle = decoder._launch, decoder._settle

    def counting(count: list[int], call, *args):
        inside: list[str] = []
        watch = counter() if counter is not None else launches(inside, decoder.runner.device)
        with host_reads() as seen, watch as launched:
            result = call(*args)
        count[0] += len(seen)
        count[1] += len(launched)
        count[2] += len(inside)
        return result

    def launched(*args):
        count = [0, 0, 0]
        step = counting(count, launch, *args)
        counts[id(step)] = count
        steps.append(step)
        return step

    decoder._launch = launched
    decoder._settle = lambda step: counting(counts[id(step)], settle, step)
    try:
        for _ in decoder.run(requests):
            pass
    finally:
        del decoder._launch, decoder._settle  # the bound methods again
    return [StepCount(*counts[id(step)]) for step in steps]
