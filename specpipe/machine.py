"""What this machine is, as far as a recipe's choice depends on it: the device and, on a CPU,
the instruction sets whose kernels decide which precision and strategy are fastest.

bf16 is exact and cheap to verify only with AMX (oneDNN's bf16 tiles), and fbgemm's fp16/int8
kernels run on AVX-512 or AVX2 at different speeds, so a recipe tuned with one set can lose its
lead on another. Read from /proc/cpuinfo where it exists (Linux), else from torch's own view.
Not a benchmark: nothing here is measured.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

FEATURES = ("avx2", "avx512", "amx")  # the ones that change a choice, slowest first
_FLAGS = {"avx2": ("avx2",), "avx512": ("avx512f",), "amx": ("amx_bf16", "amx_tile")}


@functools.cache
def cpu_features() -> tuple[str, ...]:
    """The FEATURES this CPU has."""
    flags = _cpuinfo("flags")
    if flags is not None:
        have = set(flags.split())
        return tuple(name for name in FEATURES if any(flag in have for flag in _FLAGS[name]))
    return _torch_features()


@functools.cache
def cpu_name() -> str | None:
    return _cpuinfo("model name") or platform.processor() or None


def gpu_name(device: str) -> str | None:
    """The GPU a device=cuda run uses, if any."""
    if device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def tuned_on(device: str, precision: str, date: str) -> dict:
    """A recipe's `measured.tuned_on`: where its figures were measured."""
    return {"device": device, "cpu": cpu_name(), "cpu_features": list(cpu_features()), "gpu": gpu_name(device),
            "precision": precision, "date": date}


def _cpuinfo(key: str) -> str | None:
    """The first value of `key` in /proc/cpuinfo, or None where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def _torch_features() -> tuple[str, ...]:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()  # DEFAULT | AVX2 | AVX512 | ...
    found = ["avx2"] if capability in ("AVX2", "AVX512") else []
    found += ["avx512"] if capability == "AVX512" else []
    init = getattr(torch._C._cpu, "_init_amx", None)
    return tuple(found + (["amx"] if init and init() else []))
