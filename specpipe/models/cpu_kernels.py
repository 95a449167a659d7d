"""specpipe's own CPU kernels (cpu_kernels.c): built with the machine's C compiler on first use.

What they are: a linear layer on fp16 or int8 (per output channel) weights with fp32
activations, and a whole Llama-family decoder stack in one call (engine/native_fused.py drives
it), both exact by construction: every row of a k-row call is bitwise equal to a one-row call.
What they are not: a general GEMM library. They are tuned for decode shapes (1-16 rows), where
the weights must stream at the memory's read bandwidth; a long prefill runs them too, slower
than a blocked BLAS would.

The library is compiled once per source, compiler and CPU (`-march=native`: AVX-512 or AVX2)
into the cache (`$SPECPIPE_CACHE/kernels/`), and loaded with ctypes. It links the OpenMP
runtime torch already loaded (same soname), so torch and the kernels share one thread pool
rather than spinning against each other on two cores. Where it cannot be built (no compiler,
no AVX2/FMA/F16C, `SPECPIPE_CPU_KERNELS=0`), `unavailable()` says why and the precisions fall
back to torch's kernels (quantize.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch

SOURCE = "cpu_kernels.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")  # contract off: an FMA only where written, the same at every call site
W_F16, W_I8, W_Q8 = 0, 1, 2  # weight types, as cpu_kernels.c numbers them: fp16, int8 (fp32 or int8 activations)
LINEAR_POINTERS = ("weight", "scale", "bias", "colsum")  # per linear layer in sp_stack's layer table
LAYER_COUNT = 4 * len(LINEAR_POINTERS) + 2  # q/k/v, o, gate/up, down; then the two norms


def unavailable() -> str | None:
    """Why the kernels cannot run here, or None if they can."""
    return _load()[1]


def library() -> ctypes.CDLL:
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"specpipe's CPU kernels are not available: {reason}")
    return lib


def lanes() -> int:
    """fp32 lanes of the build's vectors: 16 (AVX-512) or 8 (AVX2). What `check` names."""
    return library().sp_lanes()


def describe() -> str:
    """The kernel's name as `check` prints it."""
    reason = unavailable()
    if reason is not None:
        return f"unavailable ({reason})"
    return f"specpipe C kernel, {'AVX-512' if lanes() == 16 else 'AVX2'}, {torch.get_num_threads()} threads"


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("SPECPIPE_CPU_KERNELS", "1") == "0":
        return None, "switched off by SPECPIPE_CPU_KERNELS=0"
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if compiler is None:
        return None, "no C compiler (gcc or cc) on PATH; install gcc to build them"
    source = resources.files("specpipe.models").joinpath(SOURCE).read_bytes()
    path = _cache() / f"cpu_kernels-{_key(source, compiler)}.so"
    if not path.exists():
        reason = _build(compiler, source, path)
        if reason is not None:
            return None, reason
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return None, f"the built library does not load: {exc}"
    _declare(lib)
    return lib, None


def _cache() -> Path:
    from specpipe.models.zoo import cache_root

    return cache_root() / "kernels"


def _key(source: bytes, compiler: str) -> str:
    """Source, compiler and CPU: a build is reused only where it was made for this CPU."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = next((line for line in _cpuinfo().splitlines() if line.startswith("flags")), "")
    return hashlib.sha256(source + version.encode() + flags.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _build(compiler: str, source: bytes, path: Path) -> str | None:
    """Compile into `path` (written whole or not at all); the reason on failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as work:
            src, out = Path(work) / SOURCE, Path(work) / "lib.so"
            src.write_bytes(source)
            done = subprocess.run([compiler, *FLAGS, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["no output"])
                return f"{Path(compiler).name} could not build them: {next((l for l in first if 'error' in l), first[0])}"
            os.replace(out, path)
    except OSError as exc:
        return f"could not write the build into {path.parent}: {exc}"
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.sp_linear.argtypes = [i, p, p, p, p, i, i, p, i, p, i]
    lib.sp_linear.restype = None
    lib.sp_stack.argtypes = [p, p, i, p, f, p, p, p, i, p, p, p, p, i, p, p]
    lib.sp_stack.restype = i
    lib.sp_lanes.restype = i
    lib.sp_chunk.argtypes = [i]
    lib.sp_chunk.restype = i
    lib.sp_tile_columns.restype = i


def pack(weight: torch.Tensor, kind: int) -> torch.Tensor:
    """weight [N, K] (float16 or int8) -> the kernel's layout, flat: tiles of `sp_tile_columns`
    rows (zero rows pad the last), each tile the rows' `sp_chunk` values along K side by side,
    step after step, then each row's K % chunk tail (see cpu_kernels.c). One tile is one
    contiguous read."""
    lib = library()
    rows, chunk = lib.sp_tile_columns(), lib.sp_chunk(kind)
    n, k = weight.shape
    padded = torch.cat([weight, weight.new_zeros(-n % rows, k)]) if n % rows else weight
    tiles, main = padded.shape[0] // rows, k - k % chunk
    body = padded[:, :main].reshape(tiles, rows, main // chunk, chunk).permute(0, 2, 1, 3).reshape(tiles, -1)
    tail = padded[:, main:].reshape(tiles, -1)
    return torch.cat([body, tail], 1).reshape(-1).contiguous()


def unpack(packed: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """`pack`'s inverse: [N, K]."""
    lib = library()
    rows, chunk = lib.sp_tile_columns(), lib.sp_chunk(kind)
    tiles, main = -(-n // rows), k - k % chunk
    flat = packed.reshape(tiles, rows * k)
    body = flat[:, : rows * main].reshape(tiles, main // chunk, rows, chunk).permute(0, 2, 1, 3).reshape(tiles, rows, main)
    tail = flat[:, rows * main :].reshape(tiles, rows, k - main)
    return torch.cat([body, tail], 2).reshape(tiles * rows, k)[:n]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear(kind: int, x: torch.Tensor, weight: torch.Tensor, n: int, scale: torch.Tensor | None,
           bias: torch.Tensor | None, colsum: torch.Tensor | None = None, out: torch.Tensor | None = None,
           accumulate: bool = False) -> torch.Tensor:
    """x [M, K] float32 contiguous; weight: N rows of K float16 (W_F16) or int8 (W_I8, W_Q8; then
    scale [N] float32, and for W_Q8 colsum [N] int32, each weight row's sum), `pack`ed; bias [N]
    float32 or None -> out [M, N] float32 (= x . weight^T * scale + bias, or added into `out`
    with accumulate). W_Q8 rounds each row of x to int8 first (its own scale)."""
    m, k = x.shape
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    library().sp_linear(kind, weight.data_ptr(), _ptr(scale), _ptr(bias), _ptr(colsum), n, k, x.data_ptr(), m,
                        out.data_ptr(), int(accumulate))
    return out
