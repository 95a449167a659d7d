"""specpipe's own CPU kernels (cpu_kernels.c): built with the machine's C compiler on first use.

What they are: a linear layer on fp16 or int8 (per output channel) weights with fp32
activations, and a whole Llama-family decoder stack in one call (engine/native_fused.py drives
it), both exact by construction: every row of a k-row call is bitwise equal to a one-row call.
What they are not: a general GEMM library. They are tuned for decode shapes (1-16 rows), where
the weights must stream at the memory's read bandwidth; a long prefill runs them too, slower
than a blocked BLAS would.

The library is compiled once per source, compiler and CPU (`-march=native`: AVX-512 or AVX2;
~1.5 s) into the cache (`$SPECPIPE_CACHE/kernels/`), and loaded with ctypes. It links the OpenMP
runtime torch already loaded (same soname), so torch and the kernels share one thread pool
rather than spinning against each other on two cores. Where it cannot be built (no compiler,
no AVX2/FMA/F16C, `SPECPIPE_CPU_KERNELS=0`), `unavailable()` says why and the precisions fall
back to torch's kernels (quantize.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch

SOURCE = "cpu_kernels.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")  # contract off: an FMA only where written, the same at every call site
W_F16, W_I8, W_Q8, W_Q4 = 0, 1, 2, 3  # weight types, as cpu_kernels.c numbers them: fp16, int8 (fp32 or int8
# activations), 4-bit (int8 activations)
LINEAR_POINTERS = ("weight", "scale", "bias", "offset", "mins")  # per linear layer in sp_stack's layer table
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
    """`$SPECPIPE_KERNEL_CACHE` if set, else the cache's `kernels/` (a test suite shares one
    build across the empty model caches its tests get)."""
    from specpipe.models.zoo import cache_root

    env = os.environ.get("SPECPIPE_KERNEL_CACHE")
    return Path(env).expanduser() if env else cache_root() / "kernels"


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
    lib.sp_linear.argtypes = [i, p, p, p, p, p, i, i, p, i, p, i]
    lib.sp_linear.restype = None
    lib.sp_stack.argtypes = [p, p, i, p, f, p, p, p, i, p, p, p, p, i, p, p]
    lib.sp_stack.restype = i
    lib.sp_lanes.restype = i
    for name in ("sp_tile_columns", "sp_lane_values", "sp_k_multiple"):
        getattr(lib, name).argtypes = [i]
        getattr(lib, name).restype = i
    lib.sp_q_offset.restype = i
    lib.sp_weight_group.restype = i


def pack(weight: torch.Tensor, kind: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """weight [N, K] (float16, or int8 for W_I8 and W_Q8) -> (the kernel's layout, flat; for W_Q8
    with an activation offset, each group's int32 start per tile, else None). Tiles of
    `sp_tile_columns` columns (zero columns pad the last), one contiguous run each: float tiles
    [K][columns]; int8-activation tiles [K / lane][columns][lane] over K padded to whole groups
    (see cpu_kernels.c)."""
    lib = library()
    columns, lane, multiple = lib.sp_tile_columns(kind), lib.sp_lane_values(kind), lib.sp_k_multiple(kind)
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight, (0, -k % multiple, 0, -n % columns))  # [Np, Kp]
    tiles, kp = padded.shape[0] // columns, padded.shape[1]
    if kind != W_Q8:
        return padded.reshape(tiles, columns, kp).transpose(1, 2).contiguous().reshape(-1), None
    body = padded.reshape(tiles, columns, kp // lane, lane).permute(0, 2, 1, 3).contiguous().reshape(-1)
    if lib.sp_q_offset() == 0:
        return body, None
    sums = padded.reshape(tiles * columns, kp // multiple, multiple).sum(-1, dtype=torch.int32)  # [Np, groups]
    start = -lib.sp_q_offset() * sums.reshape(tiles, columns, -1).transpose(1, 2)  # [tiles, groups, columns]
    return body, start.contiguous().reshape(-1)


def pack_q4(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] float -> the kernel's 4-bit layout, flat uint8: per column and block of
    `sp_weight_group` (32) values of K, w ~ d * q + m with q in 0..15, d = (max - min) / 15,
    m = min, d and m in float16 (llama.cpp's Q4_1 rule and precision, so weights dequantized
    from a Q4_1 file come back on their own grid). Tiles of `sp_tile_columns` columns, K padded
    to `sp_k_multiple`; a tile is one run of blocks, each its nibbles [4][columns][4] (a byte
    holds two values of K four apart, low nibble first), then its d [columns], then its m."""
    lib = library()
    columns, multiple, group = lib.sp_tile_columns(W_Q4), lib.sp_k_multiple(W_Q4), lib.sp_weight_group()
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight.float(), (0, -k % multiple, 0, -n % columns))  # [Np, Kp]
    tiles, blocks = padded.shape[0] // columns, padded.shape[1] // group
    values = padded.reshape(tiles * columns, blocks, group)
    low, high = values.amin(-1).half(), values.amax(-1)  # [Np, blocks]
    d = ((high - low.float()) / 15.0).half()  # as Q4_1 stores them: a Q4_1 file's d and m come back exactly
    step = torch.where(d > 0, d, 1.0).float()[..., None]
    q = ((values - low.float()[..., None]) / step).round().clamp(0, 15).to(torch.uint8)
    pairs = q.reshape(tiles, columns, blocks, group // 8, 2, 4)
    nibbles = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)  # [tiles, blocks, 4, columns, 4]
    per_block = lambda t: t.reshape(tiles, columns, blocks).transpose(1, 2).contiguous().view(torch.uint8)  # noqa: E731
    return torch.cat([nibbles.reshape(tiles, blocks, -1), per_block(d), per_block(low)], -1).reshape(-1)


def unpack_q4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`pack_q4`'s inverse: the dequantized weight [N, K] float32."""
    lib = library()
    columns, multiple, group = lib.sp_tile_columns(W_Q4), lib.sp_k_multiple(W_Q4), lib.sp_weight_group()
    tiles, blocks = -(-n // columns), (k + (-k % multiple)) // group
    runs = packed.reshape(tiles, blocks, -1)
    body = columns * group // 2
    raw = runs[..., :body].reshape(tiles, blocks, group // 8, columns, 4).permute(0, 3, 1, 2, 4)  # [t, col, b, 4, 4]
    q = torch.stack([raw & 0x0F, raw >> 4], 4).reshape(tiles * columns, blocks, group).float()
    per_column = lambda t: t.contiguous().view(torch.float16).float().transpose(1, 2).reshape(-1, blocks, 1)  # noqa: E731
    d, m = per_column(runs[..., body : body + 2 * columns]), per_column(runs[..., body + 2 * columns :])
    return (q * d + m).reshape(tiles * columns, blocks * group)[:n, :k]


def unpack(packed: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """`pack`'s inverse: [N, K]."""
    lib = library()
    columns, lane, multiple = lib.sp_tile_columns(kind), lib.sp_lane_values(kind), lib.sp_k_multiple(kind)
    tiles, kp = -(-n // columns), k + (-k % multiple)
    if kind != W_Q8:
        dense = packed.reshape(tiles, kp, columns).transpose(1, 2)
    else:
        dense = packed.reshape(tiles, kp // lane, columns, lane).permute(0, 2, 1, 3)
    return dense.reshape(tiles * columns, kp)[:n, :k]


HUGE_PAGE = 2 << 20  # bytes of an x86 huge page
CHUNK = 64 << 20  # the weights' memory is mapped this many bytes at a time
_chunk: list = [None, 0]  # the chunk being filled ([bytes] uint8 tensor) and its first free byte


def resident(packed: torch.Tensor) -> torch.Tensor:
    """`packed` (a flat weight in the kernel's layout) copied into memory mapped for streaming: 2
    MiB pages (transparent huge pages, asked for with madvise) where Linux grants them. A decode
    step reads every weight once, at the memory's read rate; in 4 KiB pages a 1 GB model crosses
    250,000 pages a step, each a TLB miss (two-level in a VM) and a stop for the hardware
    prefetcher, and Qwen2.5-Coder-1.5B's step ran 10-15% slower. Small weights stay where they are;
    weights share `CHUNK`-byte mappings, each unmapped once no tensor in it is left (a tensor
    holds its mapping)."""
    size = packed.numel() * packed.element_size()
    if size < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE") or not packed.is_contiguous():
        return packed
    chunk, free = _chunk
    if chunk is None or free + size > chunk.numel():
        chunk = _new_chunk(max(CHUNK, size))
        if chunk is None:
            return packed
        free = 0
    out = chunk[free : free + size].view(packed.dtype)
    out.copy_(packed.reshape(-1))
    _chunk[:] = [chunk, free + (size + 63) // 64 * 64]
    return out


def _new_chunk(size: int) -> torch.Tensor | None:
    """`size` bytes from an anonymous mapping that starts on a huge page, or None where it fails."""
    try:
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: 4 KiB pages, as torch's own memory
        pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping: unmapped when its views are gone
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + size]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear(kind: int, x: torch.Tensor, weight: torch.Tensor, n: int, scale: torch.Tensor | None,
           bias: torch.Tensor | None, offset: torch.Tensor | None = None, mins: torch.Tensor | None = None,
           out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """x [M, K] float32 contiguous; weight, offset: N rows of K float16 (W_F16) or int8 (W_I8,
    W_Q8; then scale [N] float32), as `pack` gives them; bias [N] float32 or None -> out [M, N]
    float32 (= x . weight^T * scale + bias, or added into `out` with accumulate). W_Q8 rounds x
    to int8 first, one scale per 64 values of a row; so does W_Q4, whose weight, scale (d) and
    mins are `pack_q4`'s."""
    m, k = x.shape
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    library().sp_linear(kind, weight.data_ptr(), _ptr(scale), _ptr(bias), _ptr(offset), _ptr(mins), n, k, x.data_ptr(), m,
                        out.data_ptr(), int(accumulate))
    return out
