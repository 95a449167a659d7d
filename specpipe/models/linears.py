"""The precisions' Linear kernels (specpipe/models/quantize.py picks one per mode): fbgemm's
fp16 and int8 (`Fp16Linear`, `Int8Linear`), dense fp32/bf16 (`DenseLinear`, `Bf16Linear`, on AMX
oneDNN's prepacked 16-row blocks), int8 weights with bf16 activations (`W8A16Linear`) and
specpipe's own C kernel (`KernelLinear`: fp16, int8 and 4-bit weights). Each is an
[*, in] -> [*, out] module whose weight lives packed; `matmul` is the bare kernel the native
engine calls.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
import weakref

import torch
from torch import nn



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
