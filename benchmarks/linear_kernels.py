"""One Linear 1536 -> 8960 (Qwen2.5-1.5B's MLP shape) on every CPU kernel path torch offers.

    python benchmarks/linear_kernels.py

Prints the median ms for M = 1 / 4 / 8 rows and the batch-invariance error (row 0 computed
inside an 8-row block vs alone): what decides which precisions can serve a target (invariant)
and which pay at all (fast at small M).
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

K, N = 1536, 8960
GROUP = 32  # int4 group size


def median_ms(f, x, reps: int = 30) -> float:
    for _ in range(3):
        f(x)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def paths(weight: torch.Tensor) -> dict:
    scales = weight.abs().amax(1) / 127
    int8 = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(weight, scales.double(), torch.zeros(N, dtype=torch.long), 0, torch.qint8)
    fbgemm_int8 = torch.ops.quantized.linear_prepack(qweight, None)
    fbgemm_fp16 = torch.ops.quantized.linear_prepack_fp16(weight)
    groups = weight.reshape(N, K // GROUP, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    step = (high - low).clamp(min=1e-6) / 15
    q4 = torch.round((groups - low) / step).clamp(0, 15).to(torch.int32).reshape(N, K)
    packed4 = torch._convert_weight_to_int4pack_for_cpu(q4, 1)
    scale_zero = torch.stack([step.squeeze(-1), (low + 8 * step).squeeze(-1)], -1).transpose(0, 1).contiguous()
    return {
        "fp32 F.linear (MKL)": lambda x: torch.nn.functional.linear(x, weight),
        "fp16 weights, fbgemm linear_dynamic_fp16": lambda x: torch.ops.quantized.linear_dynamic_fp16(x, fbgemm_fp16),
        "int8 fbgemm linear_dynamic (scale per call)": lambda x: torch.ops.quantized.linear_dynamic(x, fbgemm_int8, True),
        "int8 weight-only _weight_int8pack_mm": lambda x: torch._weight_int8pack_mm(x, int8, scales),
        "int4 weight-only _weight_int4pack_mm_for_cpu": lambda x: torch._weight_int4pack_mm_for_cpu(x, packed4, GROUP, scale_zero),
    }


def main() -> None:
    torch.manual_seed(0)
    weight = torch.randn(N, K) * 0.02
    print("| path | M=1 | M=4 | M=8 | invariance error |")
    print("|---|---|---|---|---|")
    for name, f in paths(weight).items():
        ms = [median_ms(f, torch.randn(m, K)) for m in (1, 4, 8)]
        x = torch.randn(8, K)
        error = float((f(x)[:1] - f(x[:1])).abs().max())
        print(f"| {name} | " + " | ".join(f"{t:.2f}" for t in ms) + f" | {error:.1e} |")


if __name__ == "__main__":
    main()
