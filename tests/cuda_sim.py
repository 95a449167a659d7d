"""A simulated CUDA device on the CPU, to find what would fail on a GPU before one runs it.

`simulated_cuda()` lets code ask for `device="cuda"` on a CPU-only machine: every tensor placed
on "cuda" (a factory's `device=`, `.to("cuda")`, `.cuda()`, a module moved there, or any
result of such tensors) is computed on the CPU but tagged, and reports `cuda:0` as its device,
so the code takes its GPU branches (pinned copies, CUDA events, device-side generators). Tensors
made without a device stay host tensors, as torch makes them. What a GPU refuses is recorded:
an operation that mixes host tensors with device tensors (a host tensor of one element or
more; torch lets a 0-dim host tensor in as a scalar, except where it is concatenated), a
device tensor indexing a host one, a host generator drawing into a device tensor, a CPU-only
kernel (fbgemm's, oneDNN's) given device tensors. What the
simulation cannot check: kernels, streams and graph capture itself (`Graphs` runs its
computations eagerly here; tests/test_static.py checks what a capture refuses).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from typing import Iterator
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
TAG = "_simulated_cuda"

# Operations that may move data between devices, take host tensors beside device ones, or read values back.
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.copy_, torch.Tensor.__setitem__,
         torch.Tensor.pin_memory, torch.Tensor.is_pinned, torch.Tensor.tolist, torch.Tensor.item,
         torch.Tensor.numpy}
JOINS = {torch.cat, torch.stack, torch.concat, torch.hstack, torch.vstack}
CPU_ONLY = ("quantized", "mkldnn", "onednn")  # operator namespaces whose kernels are the CPU's (fbgemm, oneDNN)
DEVICE = torch.Tensor.device  # its getter is what `tensor.device` dispatches


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, TAG, False)


def _tag(t: torch.Tensor) -> torch.Tensor:
    setattr(t, TAG, True)
    return t


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class _Simulation(TorchFunctionMode):
    def __init__(self, refused: list[str]):
        super().__init__()
        self.refused = refused

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if getattr(func, "__self__", None) is DEVICE:
            return CUDA if on_device(args[0]) else func(*args)  # a host tensor's own: cpu, or meta
        if func in MOVES:
            return self._move(func, args, kwargs)
        to_device = _is_cuda(kwargs.get("device"))
        if to_device:
            kwargs["device"] = CPU
        kwargs.pop("pin_memory", None)
        generator = kwargs.get("generator")
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self._check(func, tensors, args, generator)
        out = func(*args, **kwargs)
        if to_device or any(on_device(t) for t in tensors):
            tree_map(lambda t: _tag(t) if isinstance(t, torch.Tensor) else t, out)
        return out

    def _check(self, func, tensors, args, generator) -> None:
        device = [t for t in tensors if on_device(t)]
        host = [t for t in tensors if not on_device(t) and (t.dim() > 0 or func in JOINS)]
        if func is torch.Tensor.__getitem__:  # a device tensor may be indexed by host indices, not the reverse
            if not on_device(args[0]) and device:
                self._refuse(func, "indexes a host tensor by device indices")
            return
        if device and host:
            self._refuse(func, f"mixes host tensors {[tuple(t.shape) for t in host]} with device tensors")
        if device and _namespace(func) in CPU_ONLY:
            self._refuse(func, "a CPU-only kernel on device tensors")
        if generator is not None and device and generator.device.type != "cuda":
            self._refuse(func, "draws into a device tensor from a host generator")

    def _refuse(self, func, why: str) -> None:
        caller = next((f for f in reversed(traceback.extract_stack()[:-3]) if "/specpipe/" in f.filename), None)
        where = f"{caller.filename.split('/specpipe/')[-1]}:{caller.lineno}" if caller else "?"
        self.refused.append(f"{where} {getattr(func, '__name__', func)}: {why}")

    def _move(self, func, args, kwargs):
        t = args[0]
        target = "cuda" if func is torch.Tensor.cuda else "cpu" if func is torch.Tensor.cpu else \
            _target(args, kwargs) if func is torch.Tensor.to else None
        if target is not None:  # a move: computed on the CPU, tagged by where it went
            rest = [CPU if _device_like(a) else a for a in args[1:]] if func is torch.Tensor.to else []
            options = {k: CPU if k == "device" else v for k, v in kwargs.items() if k != "non_blocking"}
            moved = t.to(*rest, **options)
            if moved is t and on_device(t) != (target == "cuda"):
                moved = moved.clone()  # another device: another tensor
            if target == "cuda" and isinstance(t, torch.nn.Parameter):
                _tag(t)  # `module.to` sets the parameter's data: the same object is then on the device
            return _tag(moved) if target == "cuda" else moved
        if func is torch.Tensor.pin_memory:
            return t
        if func is torch.Tensor.is_pinned:
            return True
        out = func(*args, **kwargs)
        if func is torch.Tensor.to and on_device(t) and isinstance(out, torch.Tensor):
            _tag(out)  # a dtype change stays on the device
        return out


def _namespace(func) -> str:
    """A `torch.ops.<namespace>.<op>` call's namespace ("" for other functions)."""
    if isinstance(func, torch._ops.OpOverload):
        return func.namespace
    return getattr(func, "_qualified_op_name", "").split("::")[0]


def _device_like(a) -> bool:
    return isinstance(a, (str, torch.device)) and not isinstance(a, torch.dtype)


def _target(args, kwargs) -> str | None:
    """The device type a `.to(...)` call moves to, if any."""
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, torch.Tensor):
            return "cuda" if on_device(a) else "cpu"
        if _device_like(a):
            return torch.device(a).type
    return None


class _Event:
    def __init__(self, enable_timing: bool = False, **_):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end: "_Event") -> float:
        return (end.at - self.at) * 1e3


class _Stream:
    def __init__(self, *_, **__):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


_REAL_GENERATOR = torch.Generator


class _DeviceGenerator(_REAL_GENERATOR):
    """A CUDA generator's stand-in: draws on the CPU, says `cuda`."""

    @property
    def device(self) -> torch.device:
        return CUDA


class _Generator(_REAL_GENERATOR):
    """`torch.Generator` while simulating: a CUDA one is a `_DeviceGenerator`, others are real."""

    def __new__(cls, device=None):
        return _DeviceGenerator() if _is_cuda(device) else _REAL_GENERATOR(*([] if device is None else [device]))


def _eager_graphs(init):
    def eager(self, device):
        init(self, device)
        self.capture = False  # no capture here: the computations run as on the CPU
    return eager


def _parameter(new):
    def made(cls, data=None, requires_grad=True):
        parameter = new(cls, data, requires_grad)
        return _tag(parameter) if on_device(data) else parameter  # a device tensor's parameter stays there
    return made


@contextlib.contextmanager
def simulated_cuda() -> Iterator[list[str]]:
    """Within the block `device="cuda"` runs on the CPU, simulated; yields what a GPU would refuse."""
    from specpipe.engine import graphs

    refused: list[str] = []
    patches = [
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "Event", _Event),
        mock.patch.object(torch.cuda, "Stream", _Stream),
        mock.patch.object(torch.cuda, "current_stream", lambda device=None: _Stream()),
        mock.patch.object(torch.cuda, "stream", lambda stream: contextlib.nullcontext()),
        mock.patch.object(torch.cuda, "synchronize", lambda device=None: None),
        mock.patch.object(torch.cuda, "get_device_name", lambda device=None: "simulated CUDA"),
        mock.patch.object(torch.cuda, "mem_get_info", lambda device=None: (64 << 30, 80 << 30)),
        mock.patch.object(torch, "Generator", _Generator),
        mock.patch.object(torch.nn.Parameter, "__new__", _parameter(torch.nn.Parameter.__new__)),
        mock.patch.object(graphs.Graphs, "__init__", _eager_graphs(graphs.Graphs.__init__)),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(_Simulation(refused))
        yield refused


class _Launches(TorchFunctionMode):
    """Entered inside the simulation: records every call that would launch a kernel on a GPU,
    one that writes a device tensor in place or makes a new tensor from (or on) the device,
    views and host-side work (pinned staging) aside; a graphed computation is one launch."""

    def __init__(self, seen: list[str]):
        super().__init__()
        self.seen, self.depth = seen, 0  # depth: inside a graphed computation (its replay is one launch)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if self.depth or name in ("tolist", "item", "__get__", "cpu", "empty", "new_empty", "empty_like"):
            return out  # reads are counted apart (decode/syncs.py); allocations launch nothing
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        device = any(on_device(t) for t in inputs + outputs) or _is_cuda(kwargs.get("device"))
        in_place = (name.endswith("_") and not name.startswith("__")) or name == "__setitem__"
        new = any(all(o.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in inputs)
                  for o in outputs)
        if device and (in_place or new):
            self.seen.append(name)
        return out


@contextlib.contextmanager
def device_launches() -> Iterator[list[str]]:
    """Within a `simulated_cuda()` block: the kernel launches the block's code would make on a
    GPU outside its CUDA graphs, by name ("graph": one graphed computation's replay)."""
    from specpipe.engine.graphs import Graphs

    seen: list[str] = []
    mode, run = _Launches(seen), Graphs.run

    def replayed(graphs, key, compute):
        if not mode.depth:
            seen.append("graph")
        mode.depth += 1
        try:
            return run(graphs, key, compute)
        finally:
            mode.depth -= 1

    with mock.patch.object(Graphs, "run", replayed), mode:
        yield seen


_RUNNING: list = []


def start(report: str) -> None:
    """The simulation for the rest of this process (a `sitecustomize` starts it in every Python
    process a script launches, to rehearse benchmarks/gpu_check.sh on the CPU); what a GPU would
    refuse is appended to the file `report` at exit."""
    import atexit

    running = simulated_cuda()
    refused = running.__enter__()
    _RUNNING.append(running)  # held: a context manager collected would end the simulation

    def write() -> None:
        with open(report, "a") as out:
            out.writelines(f"{why}\n" for why in refused)

    atexit.register(write)
