"""Weight precision of a loaded model: swap its `nn.Linear` layers for fbgemm kernels.

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

import contextlib
import functools
import itertools
import warnings
import weakref

import torch
from torch import nn

from specpipe.errors import SpecpipeError

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


class _PackedLinear(nn.Module):
    """A Linear whose weight lives in a packed form; forward is [*, in] -> [*, out] in x's dtype.
    Built from a weight [out, in] and a bias [out] or None (`of(linear)` from an nn.Linear)."""

    compute_dtype = torch.float32  # what the kernel reads

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape

    @classmethod
    def of(cls, linear: nn.Linear) -> "_PackedLinear":
        return cls(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x.reshape(-1, self.in_features).to(self.compute_dtype).contiguous())
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """[M, in] contiguous, in `compute_dtype` -> [M, out]: the bare kernel (native engine)."""
        return self._matmul(x)

    def matmul_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual [M, out] += `matmul(x)`, in place (the decoder's residual stream). Kernels
        that can fold the add into their GEMM do (`DenseLinear`); these add after it."""
        return residual.add_(self.matmul(x))


# fbgemm's packed weights are TorchScript objects, which torch.compile cannot trace as module
# attributes; the native engine's compiled graph calls them through this opaque op instead,
# naming each packed kernel by its index in _PACKED.
_HANDLES = itertools.count()
_PACKED: dict[int, "weakref.ref[_PackedLinear]"] = {}  # weak: a freed model's kernels leave


@torch.library.custom_op("specpipe::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return _PACKED[handle]()._matmul(x)


@packed_linear.register_fake
def _(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class _Opaque:
    """Mixin: `matmul` goes through `specpipe::packed_linear` (compilable)."""

    def _register(self) -> None:
        self.handle = next(_HANDLES)
        _PACKED[self.handle] = weakref.ref(self, lambda _, h=self.handle: _PACKED.pop(h, None))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return packed_linear(x, self.handle, self.out_features)
        return self._matmul(x)


class Fp16Linear(_Opaque, _PackedLinear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)
        bias = None if bias is None else bias.float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), bias)
        self._register()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)

    def dense_weight(self) -> torch.Tensor:
        return torch.ops.quantized.linear_unpack_fp16(self.packed)[0]


class Int8Linear(_Opaque, _PackedLinear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)
        weight = weight.float()
        scales = (weight.abs().amax(1) / 127.0).clamp_min(1e-8).double()  # per output channel
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor constructors warn of deprecation
            qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
        self.packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.float())
        self._register()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range: 7-bit activations avoid int16 overflow in AVX2's vpmaddubsw
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)

    def dense_weight(self) -> torch.Tensor:
        return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize()


class DenseLinear(_PackedLinear):
    """A plain `F.linear` in the weight's own dtype (the native engine's `none`: fp32, or the
    float64 of tiny test models)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.float32):
        super().__init__(weight, bias)
        self.compute_dtype = dtype
        self.weight = weight.to(dtype).contiguous()
        self.bias = None if bias is None else bias.to(dtype)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def matmul_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """One GEMM that adds into `residual` (BLAS's beta = 1) where a separate add would be a
        second kernel a layer on a GPU: two fewer launches a decoder layer. Its rounding is one
        (the sum rounded once), a row's result still depends on its own data alone."""
        if self.bias is not None or self.weight is None:
            return super().matmul_add(x, residual)
        return residual.addmm_(x, self.weight.t())

    def dense_weight(self) -> torch.Tensor:
        return self.weight


class Bf16Linear(DenseLinear):
    """bf16 linear; on CPUs with AMX, in blocks of exactly ROWS rows on oneDNN-prepacked weights.

    oneDNN picks its bf16 kernel by the row count: on CPUs with AMX a 1-row `F.linear` takes
    another kernel than a 2-row one, and 2-32 rows another than 64 (measured on Qwen2.5-1.5B's
    shapes: rows of a 5-token forward differed from one-token forwards by up to 0.24 in the
    logits). Within one row count a row's output depends neither on the other rows nor on its
    place among them, so there every decode-sized call is cut into ROWS-row blocks (the last one
    padded): a verify row is computed exactly as a one-token step. On AMX a 16-row block costs
    what one row does (the weights are read once either way), so the padding is free. Blocks of
    more than BULK rows (long prefills, never compared with one-token rows) run as one call. The
    weight is reordered once into oneDNN's blocked layout for ROWS rows (what torch.compile's
    freezing does): a Qwen-1.5B step took 174 ms with `F.linear` re-reading the plain layout,
    141 ms packed. Without AMX (the AVX2 CPUs of docs/engine.md) bf16 compute is slow, so
    padding would cost ~k times a row, and a plain `F.linear` per call was measured bitwise
    there: it stays as it was."""

    ROWS = 16
    BULK = 256

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias, torch.bfloat16)
        self.packed = _mkldnn_pack(self.weight, self.ROWS) if has_amx() else None  # None: plain F.linear
        if self.packed is not None:
            self.weight = None  # the pack holds it: one copy in memory

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.packed is None or m > self.BULK:
            return self._call(x)
        padded = torch.nn.functional.pad(x, (0, 0, 0, -m % self.ROWS))  # [ceil(m / ROWS) * ROWS, in]
        if m <= self.ROWS:  # a plain step or a verify block: one call, no concatenation (the hot path)
            return self._call(padded)[:m]
        return torch.cat([self._call(block) for block in padded.split(self.ROWS)])[:m]

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def dense_weight(self) -> torch.Tensor:
        return self.weight if self.packed is None else self.packed.to_dense()

    def unpack(self) -> None:
        """Back to a plain weight (before a move to another device)."""
        if self.packed is not None:
            self.weight, self.packed = self.packed.to_dense(), None


@contextlib.contextmanager
def bulk_rows():
    """Within: bf16 linears take every call in one oneDNN call, whatever its row count, instead
    of exact 16-row blocks. For the training passes only (self-distilled answers, features),
    whose rows no verify compares with one-token rows: a block re-reads the weights, so a
    250-token feature pass of Qwen2.5-1.5B took 1.55 s in blocks and 0.60 s in one call, and a
    32-row distillation step half as long (2-core Intel Xeon with AMX). The values differ from the exact
    kernel's in the last bits (bf16 rounding of another summation order), as hf's do from the
    native engine's: the same model's greedy answers, not the bench's byte for byte."""
    saved = Bf16Linear.BULK
    Bf16Linear.BULK = 0
    try:
        yield
    finally:
        Bf16Linear.BULK = saved


@functools.cache
def has_amx() -> bool:
    """Whether this CPU has AMX bf16 tiles that oneDNN may use (torch asks the kernel for them)."""
    init = getattr(torch._C._cpu, "_init_amx", None)
    return bool(init and init())


def _mkldnn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """`weight` [out, in] bf16 reordered for oneDNN calls of `rows` rows, or None where that is
    not possible (another device, a build without oneDNN)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        probe = torch.ones(rows, weight.shape[1], dtype=torch.bfloat16)
        torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except RuntimeError:
        return None
    return packed


class W8A16Linear(_PackedLinear):
    """int8 per-output-channel weights, bf16 activations and scales."""

    compute_dtype = torch.bfloat16

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)
        weight = weight.float()
        scales = (weight.abs().amax(1) / 127.0).clamp_min(1e-8)  # [out]
        self.qweight = (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
        self.scales = scales.to(torch.bfloat16)
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x, self.qweight, self.scales)
        return y if self.bias is None else y + self.bias

    def dense_weight(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]


class KernelLinear(_Opaque, _PackedLinear):
    """fp16 or int8 (per output channel) weights on specpipe's C kernel (cpu_kernels.c), fp32
    activations, or int8 ones (`kind` W_Q8: one scale per 64 values of a row): every output one
    sum in a fixed order (K order in fp32, or int32 sums per group), so a row's result does not
    depend on how many rows the call has. The residual add of `matmul_add` runs in the kernel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: int = 0):
        from specpipe.models.cpu_kernels import W_F16, W_Q4, pack, pack_q4, resident

        super().__init__(weight, bias)
        self.kind = kind
        weight = weight.float()
        self.scale = self.offset = self.mins = None
        self.bias = None if bias is None else bias.float().contiguous()
        self._register()
        if kind == W_Q4:
            self.weight = resident(pack_q4(weight))  # d and m inside, beside the nibbles they scale
            return
        if kind == W_F16:
            weight = weight.to(torch.float16)
        else:
            scale = (weight.abs().amax(1) / 127.0).clamp_min(1e-8)  # [out]
            weight = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
            self.scale = scale.contiguous()
        packed, self.offset = pack(weight, kind)  # flat, in the kernel's tiles
        self.weight = resident(packed)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        from specpipe.models import cpu_kernels

        return cpu_kernels.linear(self.kind, x, self.weight, self.out_features, self.scale, self.bias, self.offset,
                                  self.mins)

    def matmul_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or not residual.is_contiguous() or residual.dtype != torch.float32:
            return super().matmul_add(x, residual)
        from specpipe.models import cpu_kernels

        return cpu_kernels.linear(self.kind, x, self.weight, self.out_features, self.scale, self.bias, self.offset,
                                  self.mins, out=residual, accumulate=True)

    def dense_weight(self) -> torch.Tensor:
        from specpipe.models.cpu_kernels import W_Q4, unpack, unpack_q4

        if self.kind == W_Q4:
            return unpack_q4(self.weight, self.out_features, self.in_features)
        weight = unpack(self.weight, self.kind, self.out_features, self.in_features).float()
        return weight if self.scale is None else weight * self.scale[:, None]


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


def _kernel(mode: str):
    """The Linear class of `mode` here: specpipe's C kernel for fp16 and w8a32 where it builds."""
    if on_kernel(mode):
        from specpipe.models.cpu_kernels import W_F16, W_I8, W_Q4, W_Q8

        return functools.partial(KernelLinear, kind={"fp16": W_F16, "w8a32": W_I8, "w8a8": W_Q8, "w4a8": W_Q4}[mode])
    if mode in NEEDS_KERNEL:
        raise SpecpipeError(f"model.quantize={mode} runs on specpipe's C kernel, which cannot run here: "
                            f"{kernel_reason()}. Use model.quantize=fp16 or w8a16.")
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
