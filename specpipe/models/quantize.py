"""Weight precision of a loaded model: swap its `nn.Linear` layers for fbgemm kernels.

Modes (measured on this project's 2-core AVX2 CPU, README "Precision"):
- `none`: fp32 weights, MKL. Batch-invariant to ~1e-6, but verifying k tokens costs ~k/2 times
  one token on this CPU, which starves speculation.
- `fp16`: fp16 weights, fp32 compute (fbgemm `linear_dynamic_fp16`). Half the memory traffic,
  batch-invariant to ~1e-6 like fp32: safe for a target.
- `int8`: int8 per-channel weights, int8 activations with one scale per call (fbgemm
  `linear_dynamic`). Fastest, but the activation scale depends on every row of the block, so a
  verify forward is not computed like a one-token forward: use it for drafts and twins, never
  for a target whose output must be preserved (the pipeline refuses that).
int4 is not offered: torch's CPU int4/int8 weight-only kernels (`_weight_int4pack_mm_for_cpu`,
`_weight_int8pack_mm`) are 5-20x slower than fp32 on this CPU, so they never pay.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from specpipe.errors import SpecpipeError

MODES = ("none", "fp16", "int8")
TARGET_SAFE = ("none", "fp16")  # batch-invariant: verify rows equal one-token rows


class _PackedLinear(nn.Module):
    """A Linear whose weight lives in an fbgemm packed form; forward is [*, in] -> [*, out]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x.reshape(-1, self.in_features).float().contiguous())
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Fp16Linear(_PackedLinear):
    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.detach().float(), bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)

    def dense_weight(self) -> torch.Tensor:
        return torch.ops.quantized.linear_unpack_fp16(self.packed)[0]


class Int8Linear(_PackedLinear):
    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(1) / 127.0).clamp_min(1e-8).double()  # per output channel
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor constructors warn of deprecation
            qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range: 7-bit activations avoid int16 overflow in AVX2's vpmaddubsw
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)

    def dense_weight(self) -> torch.Tensor:
        return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize()


_KERNELS = {"fp16": Fp16Linear, "int8": Int8Linear}


def dense_weight(module: nn.Module) -> torch.Tensor:
    """A Linear's weight [out, in] as float32, whether plain or packed here."""
    weight = module.dense_weight() if isinstance(module, _PackedLinear) else module.weight
    return weight.detach().float()


def check_mode(mode: str, what: str) -> str:
    if mode not in MODES:
        raise SpecpipeError(
            f"{what}={mode!r} is not a known precision. Use one of: {', '.join(MODES)} "
            "(int4 has no fast CPU kernel in torch; see README 'Precision')."
        )
    return mode


def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Swap every nn.Linear (lm_head included) for the `mode` kernel, in place."""
    if mode == "none":
        return model
    kernel = _KERNELS[mode]
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, kernel(child))
    return model
