"""Two builds of specpipe's CPU kernel, alternated call by call in one process.

Usage: python benchmarks/kernel_ab.py --before=REV [--after=REV] [--rows=1,3,5,9] [--layers=8]
       [--kind=w4a8|w8a8] [--reps=25]
       python benchmarks/kernel_ab.py --peak   (AVX512-VNNI CPUs: the int8 multiply-add peak)

Builds specpipe/models/cpu_kernels.c as it was at git revision REV (`--after`: default the
working tree's) and times one call of each linear of `layers` Qwen2.5-1.5B decoder layers
(gate+up 1536 -> 17920, down 8960 -> 1536, q/k/v 1536 -> 2048; 8 layers: 222 MB in `w4a8`, past
the L3 of the 2-core machines) for each row count, before and after in turn. This host's speed
swings between processes and over minutes; alternating the two builds call by call in one process
puts both under the same swings. Prints min and median ms of each and whether their outputs are
bitwise equal (a kernel change that keeps the arithmetic must keep every bit).

--peak times 12 independent `vpdpbusd` (64 int8 multiply-adds each) per loop, on every thread:
the roof a compute-bound verify's tiles are measured against (`after GMAC/s`); then the
instructions of one step of a 5-row 4-bit tile written out (two nibble loads and their
unpacking, ten broadcasts, twenty `vpdpbusd`, on bytes in L1): what the tile's pattern allows.
Run it alone on the machine: its figures are timings.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specpipe.models import cpu_kernels

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "specpipe/models/cpu_kernels.c"
SHAPES = ((17920, 1536), (1536, 8960), (2048, 1536))  # one Qwen2.5-1.5B layer: gate+up, down, q/k/v
KINDS = {"w4a8": cpu_kernels.W_Q4, "w8a8": cpu_kernels.W_Q8}


def build(rev: str | None, work: Path) -> ctypes.CDLL:
    """The kernel library compiled from `rev`'s source (None: the working tree's)."""
    name = rev or "tree"
    source = work / f"{name}.c"
    if rev is None:
        source.write_bytes((ROOT / SOURCE).read_bytes())
    else:
        source.write_bytes(subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True,
                                          capture_output=True).stdout)
    out = work / f"{name}.so"
    subprocess.run(["gcc", *cpu_kernels.FLAGS, str(source), "-o", str(out), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    cpu_kernels._declare(lib)
    return lib


PEAK = r"""
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#define DP(x, w, acc) "vpdpbusd %%" x ", %%" w ", %%" acc "\n\t"
static int32_t bytes[64] __attribute__((aligned(64)));
int main(void) {
    const long iters = 100000000;
    double start = omp_get_wtime();
#pragma omp parallel
    for (long i = 0; i < iters; i++) /* 12 independent multiply-adds: the roof */
        __asm__ volatile(DP("zmm30", "zmm31", "zmm0") DP("zmm30", "zmm31", "zmm1") DP("zmm30", "zmm31", "zmm2")
                         DP("zmm30", "zmm31", "zmm3") DP("zmm30", "zmm31", "zmm4") DP("zmm30", "zmm31", "zmm5")
                         DP("zmm30", "zmm31", "zmm6") DP("zmm30", "zmm31", "zmm7") DP("zmm30", "zmm31", "zmm8")
                         DP("zmm30", "zmm31", "zmm9") DP("zmm30", "zmm31", "zmm10") DP("zmm30", "zmm31", "zmm11")
                         ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
    double roof = omp_get_wtime() - start;
    start = omp_get_wtime();
#pragma omp parallel
    for (long i = 0; i < iters / 2; i++) /* one step of a 5-row 4-bit tile, as cpu_kernels.c's, from L1 */
        __asm__ volatile(
            "vpandd (%0), %%zmm27, %%zmm30\n\t" "vpsrlw $4, (%0), %%zmm28\n\t" "vpandd %%zmm27, %%zmm28, %%zmm28\n\t"
            "vpandd 64(%0), %%zmm27, %%zmm31\n\t" "vpsrlw $4, 64(%0), %%zmm29\n\t" "vpandd %%zmm27, %%zmm29, %%zmm29\n\t"
            "vpbroadcastd 0(%1), %%zmm20\n\t" "vpbroadcastd 4(%1), %%zmm21\n\t"
            DP("zmm20", "zmm30", "zmm0") DP("zmm20", "zmm31", "zmm1") DP("zmm21", "zmm28", "zmm0") DP("zmm21", "zmm29", "zmm1")
            "vpbroadcastd 8(%1), %%zmm20\n\t" "vpbroadcastd 12(%1), %%zmm21\n\t"
            DP("zmm20", "zmm30", "zmm2") DP("zmm20", "zmm31", "zmm3") DP("zmm21", "zmm28", "zmm2") DP("zmm21", "zmm29", "zmm3")
            "vpbroadcastd 16(%1), %%zmm20\n\t" "vpbroadcastd 20(%1), %%zmm21\n\t"
            DP("zmm20", "zmm30", "zmm4") DP("zmm20", "zmm31", "zmm5") DP("zmm21", "zmm28", "zmm4") DP("zmm21", "zmm29", "zmm5")
            "vpbroadcastd 24(%1), %%zmm20\n\t" "vpbroadcastd 28(%1), %%zmm21\n\t"
            DP("zmm20", "zmm30", "zmm6") DP("zmm20", "zmm31", "zmm7") DP("zmm21", "zmm28", "zmm6") DP("zmm21", "zmm29", "zmm7")
            "vpbroadcastd 32(%1), %%zmm20\n\t" "vpbroadcastd 36(%1), %%zmm21\n\t"
            DP("zmm20", "zmm30", "zmm8") DP("zmm20", "zmm31", "zmm9") DP("zmm21", "zmm28", "zmm8") DP("zmm21", "zmm29", "zmm9")
            :: "r"(bytes), "r"(bytes + 32)
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm20", "xmm21",
              "xmm28", "xmm29", "xmm30", "xmm31");
    double tile = omp_get_wtime() - start;
    int threads = omp_get_max_threads();
    printf("%d threads: %.2f G vpdpbusd/s a thread (%.0f GMAC/s in all); a 5-row 4-bit tile's steps from L1: "
           "%.2f G vpdpbusd/s a thread\n", threads, iters * 12 / roof / 1e9, threads * iters * 12 * 64 / roof / 1e9,
           iters / 2 * 20 / tile / 1e9);
    return 0;
}
"""


def peak() -> None:
    """The int8 multiply-add peak of this CPU's AVX512-VNNI units, on every thread."""
    if " avx512_vnni" not in cpu_kernels._cpuinfo():
        raise SystemExit("--peak times AVX512-VNNI instructions, which this CPU does not have")
    with tempfile.TemporaryDirectory() as work:
        source, binary = Path(work) / "peak.c", Path(work) / "peak"
        source.write_text(PEAK)
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", str(source), "-o", str(binary)], check=True)
        print(subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.strip())


def weights(kind: int, layers: int) -> list[tuple]:
    """(n, k, packed, scale, offset) of every linear, packed as the engine packs them."""
    torch.manual_seed(0)
    out = []
    for n, k in SHAPES * layers:
        if kind == cpu_kernels.W_Q4:
            out.append((n, k, cpu_kernels.resident(cpu_kernels.pack_q4(torch.randn(n, k) * 0.02)), None, None))
        else:
            body, offset = cpu_kernels.pack(torch.randint(-127, 128, (n, k), dtype=torch.int8), kind)
            out.append((n, k, cpu_kernels.resident(body), torch.rand(n) * 0.01, offset))
    return out


def call(lib: ctypes.CDLL, kind: int, linears: list[tuple], xs: list[torch.Tensor], ys: list[torch.Tensor]) -> float:
    """Seconds for one call of each linear, x [M, K] -> y [M, N]."""
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    start = time.perf_counter()
    for (n, k, packed, scale, offset), x, y in zip(linears, xs, ys):
        lib.sp_linear(kind, packed.data_ptr(), ptr(scale), None, ptr(offset), None, n, k, x.data_ptr(), len(x),
                      y.data_ptr(), 0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before")
    parser.add_argument("--peak", action="store_true")
    parser.add_argument("--after", default=None)
    parser.add_argument("--rows", default="1,3,5,9")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kind", choices=sorted(KINDS), default="w4a8")
    parser.add_argument("--reps", type=int, default=25)
    args = parser.parse_args()
    if args.peak:
        return peak()
    if args.before is None:
        parser.error("--before=REV is needed (or --peak)")
    kind = KINDS[args.kind]
    with tempfile.TemporaryDirectory() as work:
        libs = {"before": build(args.before, Path(work)), "after": build(args.after, Path(work))}
        linears = weights(kind, args.layers)
        macs = sum(n * k for n, k, *_ in linears)
        print(f"{args.kind}, {len(linears)} linears, {sum(p.numel() for _, _, p, *_ in linears) / 1e6:.0f} MB, "
              f"{torch.get_num_threads()} threads")
        print("| rows | before min / median ms | after min / median ms | after GMAC/s | bitwise equal |")
        print("|---|---|---|---|---|")
        for m in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(m, k) for _, k, *_ in linears]
            ys = {name: [torch.empty(m, n) for n, *_ in linears] for name in libs}
            times = {name: [] for name in libs}
            for _ in range(args.reps + 3):
                for name, lib in libs.items():
                    times[name].append(call(lib, kind, linears, xs, ys[name]))
            kept = {name: t[3:] for name, t in times.items()}  # the first calls warm the caches
            equal = all(torch.equal(a, b) for a, b in zip(ys["before"], ys["after"]))
            cells = [f"{min(t) * 1e3:.2f} / {statistics.median(t) * 1e3:.2f}" for t in kept.values()]
            print(f"| {m} | {cells[0]} | {cells[1]} | {macs * m / min(kept['after']) / 1e9:.0f} | {equal} |")


if __name__ == "__main__":
    main()
