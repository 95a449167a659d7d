"""Weight precision of a loaded model: swap its `nn.Linear` layers for packed kernels (the
kernels themselves: specpipe/models/linears.py); which precision runs where, and its guarantee.

Modes (measured on a 2-core AMD EPYC with AVX2; the tables are in docs/engine.md):
- `none`: fp32 weights, MKL. Batch-invariant to ~1e-6, but verifying k tokens costs ~k/2 times
  one token on this CPU, which starves speculation.
- `fp16`: fp16 weights, fp32 compute (fbgemm `linear_dynamic_fp16`). Half the memory traffic,
  batch-invariant to ~1e-6 like fp32: safe for a target.
- `int8`: int8 per-channel weights, int8 activations with one scale per call (fbgemm
  `linear_dynamic`). Fastest, but the activation scale depends on every row of the block, so a
  verify forward is not computed like a one-token forward: use it for drafts and twins, never
  for a target whose output must be preserved (the pipeline refuses that).
- `bf16`: bf16 weights and bf16 activations (`F.linear`; on CPUs with AMX, oneDNN on prepacked
  weights in fixed 16-row blocks, `Bf16Linear`), native engine only. Every row of a k-row block
  is bitwise equal to a one-row call, on AVX2 and on AMX CPUs alike: the `exact` guarantee.
- `w8a16`: int8 per-channel weights, bf16 activations (`_weight_int8pack_mm`, its AVX2 kernel is
  bf16-only: with fp32 activations it falls back to a scalar loop 7-20x slower), native engine
  only. Each output is one fixed-order loop over K: `exact` too, at half bf16's weight bytes.
- `w8a32`: int8 per-channel weights, fp32 activations, on specpipe's own C kernel
  (cpu_kernels.c): half fp16's bytes, `exact` on the native engine. Needs the kernel.
- `w8a8`: int8 per-channel weights, int8 activations with one scale per row (per token), on
  the C kernel: int32 sums, exact in any order, so `exact` on the native engine, and four times
  fp32's multiply-adds per instruction with AVX512-VNNI: a verify block costs little more than
  one token. The rows' rounding to int8 is the price (see docs/engine.md for what it measured).
- `w4a8`: 4-bit weights (asymmetric, d and m per 64 values of a column, as llama.cpp's Q4_1),
  int8 activations as `w8a8`'s, on the C kernel: a quarter of fp16's bytes, `exact` on the
  native engine, at 4-bit rounding (the zoo's models are 4-bit GGUF files to begin with).
Where specpipe's C kernel builds (a C compiler and AVX2/FMA/F16C: cpu_kernels.py), `fp16` runs on
it too, instead of fbgemm: each output one dot product in a fixed order whatever the row count,
so `fp16` is `exact` on the native engine there (fbgemm's fp16 GEMM sums each row count in
another order: `tolerance`).
int4 is not offered: torch's CPU int4 weight-only kernel has no fast path for this CPU's
activations, and fbgemm has no int4 kernel.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from specpipe.errors import Refusal, SpecpipeError, refuse
from specpipe.models.linears import (Bf16Linear, DenseLinear, Fp16Linear, Int8Linear, KernelLinear, W8A16Linear,
                                      _PackedLinear, has_amx)

MODES = ("none", "fp16", "int8", "bf16", "w8a16", "w8a32", "w8a8", "w4a8")
TARGET_SAFE = ("none", "fp16", "bf16", "w8a16", "w8a32", "w8a8", "w4a8")  # verify rows equal one-token rows (within tolerance or bitwise)
BF16 = ("bf16", "w8a16")  # bf16 activations (and KV cache) end to end
EXACT = BF16  # attention row by row in the torch forward: what a bitwise verify needs (native_model.py)
NATIVE_ONLY = BF16  # they need bf16 activations end to end, which only the native forward keeps
ON_KERNEL = ("fp16", "w8a32", "w8a8", "w4a8")
NEEDS_KERNEL = ("w8a32", "w8a8", "w4a8")  # no torch kernel stands in for these  # run on specpipe's C kernel where it builds (cpu_kernels.py)
GUARANTEE = {"none": "tolerance", "fp16": "tolerance", "int8": "draft only", "bf16": "exact", "w8a16": "exact",
             "w8a32": "exact", "w8a8": "exact", "w4a8": "exact"}  # what each gives without specpipe's C kernel (see `guarantee`)
GGUF = "gguf"  # engine=llamacpp: the GGUF file's own quantization runs (not a mode of this module)
AUTO = "auto"  # the device's own: the fastest precision it runs with the strongest guarantee it has
BY_DEVICE = {"cpu": "fp16", "cuda": "bf16"}  # fbgemm fp16 weights on the CPU; bf16 on cuBLAS
CPU_ONLY = ("fp16", "int8", "w8a32", "w8a8", "w4a8")  # fbgemm and specpipe's C kernels: no CUDA kernel


def resolve_precision(mode: str, device: str, draft: bool = False, engine: str = "auto",
                      four_bit: bool = False) -> str:
    """`auto` as the device's precision (with engine=llamacpp: `gguf`, the file's own types). A
    target whose weights come from a 4-bit GGUF file (`four_bit`: the zoo's, or a Q4 file) runs
    `w4a8` on the CPU's native engine where specpipe's kernel builds: its layers come back on
    their 4-bit grid, in the numbers llama.cpp decodes that file with. A draft or head
    (draft=True) may run any precision (the target verifies it), so a CPU-only kernel asked for
    on a GPU becomes the GPU's precision; a target's explicit choice is kept, and refused later
    if the device or engine cannot run it."""
    if mode == AUTO and engine == "llamacpp":
        return GGUF
    if mode == AUTO and four_bit and not draft and device == "cpu" and engine in ("auto", "native") and on_kernel("w4a8"):
        return "w4a8"
    if mode == AUTO or (draft and device != "cpu" and mode in CPU_ONLY):
        return BY_DEVICE.get(device, "none")
    return mode


def activation_dtype(mode: str, model_dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype activations flow in between layers of a native forward in `mode` (`none`
    keeps the model's own float dtype: float64 tiny models in tests stay float64)."""
    if mode in BF16:
        return torch.bfloat16
    return model_dtype if mode == "none" else torch.float32


def on_kernel(mode: str) -> bool:
    """Whether `mode` runs on specpipe's C kernel here (else torch's kernel, or refused: w8a32)."""
    if mode not in ON_KERNEL:
        return False
    from specpipe.models import cpu_kernels

    return cpu_kernels.unavailable() is None


def kernel_reason() -> str | None:
    """Why specpipe's C kernel cannot run here (None: it can)."""
    from specpipe.models import cpu_kernels

    return cpu_kernels.unavailable()


def guarantee(mode: str, native: bool = True) -> str:
    """`exact`, `tolerance` or `draft only`: what a target in `mode` gives on this machine. On the
    kernel a verify row is bitwise a one-token row when the native engine runs it (its fused
    forward attends row by row too); transformers' forward (engine=hf) attends blocks at once."""
    if mode in ON_KERNEL and on_kernel(mode):
        return "exact" if native else "tolerance"
    if mode == "bf16" and native:
        return "exact" if bf16_exact() else "tolerance"
    return GUARANTEE[mode]


def kernel_name(mode: str, device: str = "cpu", native: bool = True) -> str:
    """The kernel a target in `mode` runs on, and its guarantee, as `specpipe check` names them."""
    if device != "cpu":
        return f"{'cuBLAS' if mode in ('bf16', 'none') else 'no kernel'} on {device}"
    if mode in ON_KERNEL and on_kernel(mode):
        from specpipe.models import cpu_kernels

        how = {"fp16": "fp16 weights, fp32 sums in K order", "w8a32": "int8 weights, fp32 sums in K order",
               "w8a8": "int8 weights and activations (a scale per 64 values), int32 sums",
               "w4a8": "4-bit weights (d, m per 32 values), int8 activations (a scale per 64), int32 sums, "
                       "an 8-bit LM head"}[mode]
        name = f"{cpu_kernels.describe()}: {how}"
    elif mode in NEEDS_KERNEL:
        return f"none: specpipe's C kernel cannot run here ({kernel_reason()})"
    elif mode == "bf16":
        name = "oneDNN bf16 on prepacked weights in 16-row blocks (AMX)" if has_amx() else "oneDNN bf16 (F.linear)"
    else:
        name = {"none": "fp32 F.linear (MKL)", "fp16": "fbgemm fp16 (linear_dynamic_fp16)",
                "int8": "fbgemm dynamic int8", "w8a16": "_weight_int8pack_mm, bf16 activations"}[mode]
    return f"{name}; {guarantee(mode, native)}"


@functools.cache
def bf16_exact() -> bool:
    """Whether this CPU's bf16 linear (Bf16Linear) gives every row of a 2-16-row call bitwise as a
    one-row call, measured once (a probe of ~0.2 s) on the shape where it was found to break
    (a K = 8960 down projection): oneDNN picks its bf16 kernel by row count, AMX's packed
    16-row blocks and AVX2's plain path keep rows apart, AVX512-BF16 without AMX does not."""
    generator = torch.Generator().manual_seed(0)
    layer = Bf16Linear(torch.randn(1536, 8960, generator=generator) * 0.02, None)  # the whole projection: a
    # 256-output slice of it was bitwise where the whole is not (an AVX512-BF16 CPU without AMX)
    x = torch.randn(16, 8960, generator=generator).to(torch.bfloat16)
    alone = torch.cat([layer.matmul(x[i : i + 1]) for i in range(16)])
    return all(torch.equal(layer.matmul(x[:rows]), alone[:rows]) for rows in (2, 5, 9, 16))


_KERNELS = {"fp16": Fp16Linear, "int8": Int8Linear, "bf16": Bf16Linear, "w8a16": W8A16Linear}


def kernel_refusal(mode: str) -> Refusal | None:
    """A precision that runs on specpipe's C kernel where the kernel cannot run (None: it can,
    or the precision does not need it)."""
    if mode not in NEEDS_KERNEL or kernel_reason() is None:
        return None
    return Refusal(f"model.quantize={mode} runs on specpipe's C kernel, which cannot run here: {kernel_reason()}",
                   "use model.quantize=fp16 or w8a16")


def cuda_refusal(mode: str) -> Refusal | None:
    """A target precision on a GPU: only dense weights (bf16, none) have CUDA kernels here."""
    if mode in ("none", "bf16"):
        return None
    return Refusal(f"model.quantize={mode} runs on CPU kernels only (fbgemm, specpipe's own)",
                   "drop model.quantize (auto: bf16 on cuda), or pass model.quantize=bf16 or none")


def _kernel(mode: str):
    """The Linear class of `mode` here: specpipe's C kernel for fp16 and w8a32 where it builds."""
    if on_kernel(mode):
        from specpipe.models.cpu_kernels import W_F16, W_I8, W_Q4, W_Q8

        return functools.partial(KernelLinear, kind={"fp16": W_F16, "w8a32": W_I8, "w8a8": W_Q8, "w4a8": W_Q4}[mode])
    refuse(kernel_refusal(mode))
    return _KERNELS[mode]


def linear_kernel(weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                  dtype: torch.dtype = torch.float32) -> _PackedLinear:
    """A Linear [*, in] -> [*, out] with `weight` [out, in] in the `mode` kernel (none: dense
    in `dtype`)."""
    bias = None if bias is None else bias.detach()
    if mode == "none":
        return DenseLinear(weight.detach(), bias, dtype)
    return _kernel(mode)(weight.detach(), bias)


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's weights, packed kernels included (an fbgemm pack hides its tensors:
    its size is computed from its shape and the precision it stores)."""
    total = sum(t.numel() * t.element_size() for t in module.parameters())
    total += sum(t.numel() * t.element_size() for t in module.buffers())
    for sub in module.modules():
        total += _packed_bytes(sub)
    return total


def _packed_bytes(module: nn.Module) -> int:
    if isinstance(module, Fp16Linear):
        return module.in_features * module.out_features * 2 + module.out_features * 4
    if isinstance(module, Int8Linear):
        return module.in_features * module.out_features + module.out_features * 8
    if isinstance(module, Bf16Linear) and module.packed is not None:
        return module.in_features * module.out_features * 2 + (0 if module.bias is None else module.out_features * 2)
    if isinstance(module, (DenseLinear, W8A16Linear, KernelLinear)):
        return sum(t.numel() * t.element_size() for t in vars(module).values() if isinstance(t, torch.Tensor))
    return 0


def dense_bias(module: nn.Module) -> torch.Tensor | None:
    """A Linear's bias [out] in the dtype it is stored in, or None, whether plain or packed here."""
    if isinstance(module, KernelLinear):
        bias = module.bias
    elif isinstance(module, Fp16Linear):
        bias = torch.ops.quantized.linear_unpack_fp16(module.packed)[1]
    elif isinstance(module, Int8Linear):
        bias = torch.ops.quantized.linear_unpack(module.packed)[1]
    else:
        bias = getattr(module, "bias", None)
    return None if bias is None else bias.detach()


def move_kernel(module: nn.Module, device: torch.device) -> nn.Module:
    """A kernel on another device: fp32 and bf16 move; fbgemm's packed kernels are CPU-only."""
    if isinstance(module, nn.Linear):
        return module.to(device)
    if isinstance(module, DenseLinear):
        if isinstance(module, Bf16Linear):
            module.unpack()
        module.weight = module.weight.to(device)
        module.bias = None if module.bias is None else module.bias.to(device)
        return module
    raise SpecpipeError(f"precision {type(module).__name__} runs on the CPU only (fbgemm / CPU int8 kernels); "
                        f"on {device} use model.quantize=bf16 or none.")


def dense_weight(module: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A Linear's weight [out, in] (float32 unless asked), whether plain or packed here."""
    weight = module.dense_weight() if isinstance(module, _PackedLinear) else module.weight
    return weight.detach().to(dtype)


def check_mode(mode: str, what: str) -> str:
    if mode not in MODES and mode != AUTO:
        raise SpecpipeError(
            f"{what}={mode!r} is not a known precision. Use one of: auto, {', '.join(MODES)} "
            "(int4 has no fast CPU kernel in torch; see docs/engine.md, 'Precisions')."
        )
    return mode


def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Swap every nn.Linear (lm_head included) for the `mode` kernel, in place."""
    if mode == "none":
        return model
    kernel = _kernel(mode)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, kernel(child.weight.detach(), None if child.bias is None else child.bias.detach()))
    return model
