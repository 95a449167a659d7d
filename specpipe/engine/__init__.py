"""Runners: one model and its KV cache behind one interface (base.py), three engines.

`make_runner(model, engine=..., precision=...)` is the only place that picks one: `native`
(native.py, the families of native_families.py), `hf` (hf.py, any transformers model), `auto` (native
where the architecture is supported, hf otherwise), or `llamacpp` (llamacpp.py: the model's
GGUF file on llama.cpp's CPU kernels; `model` is then the resolved source, not torch weights).
"""

from __future__ import annotations

import torch

from specpipe.engine.base import FINAL, KERNELS, Memory, Runner, Tail, TailInputs, TargetOutput
from specpipe.errors import SpecpipeError

ENGINES = ("auto", "native", "hf", "llamacpp")
DEVICES = ("cpu", "cuda")
GRAPHS = ("auto", "on", "off")  # engine=native's static step (engine/static.py); auto: on where device=cuda

__all__ = ["ENGINES", "FINAL", "GRAPHS", "KERNELS", "Memory", "Runner", "Tail", "TailInputs", "TargetOutput",
           "make_runner", "pick_engine", "static_step"]


def static_step(graphs: str, device: str) -> bool:
    """Whether `graphs=` means the static step on `device` (auto: on CUDA only)."""
    return graphs == "on" or (graphs == "auto" and device == "cuda")


def pick_engine(model: torch.nn.Module, engine: str = "auto", precision: str = "none") -> str:
    """The engine `engine=` means for this model ('native', 'hf' or 'llamacpp'), or a SpecpipeError."""
    from specpipe.engine.native_model import unsupported_reason
    from specpipe.models.quantize import NATIVE_ONLY

    if engine not in ENGINES:
        raise SpecpipeError(f"engine={engine!r} is not an engine. Use one of: {', '.join(ENGINES)}.")
    if engine == "llamacpp":
        return engine
    reason = unsupported_reason(model)
    if engine == "native" and reason is not None:
        raise SpecpipeError(f"engine=native cannot run this model: {reason}. Use engine=hf (or auto).")
    chosen = "native" if engine == "native" or (engine == "auto" and reason is None) else "hf"
    if chosen == "hf" and precision in NATIVE_ONLY:
        raise SpecpipeError(f"precision {precision} needs the native engine (bf16 activations end to end), which "
                            f"{'was not chosen' if reason is None else 'cannot run this model: ' + reason}. Use "
                            "fp16 or none, or engine=native.")
    return chosen


def make_runner(model, *, engine: str = "auto", precision: str = "none", cache_len: int | None = None,
                device: str = "cpu", compile: bool = False, kernels: str = "exact", graphs: str = "auto") -> Runner:
    """A runner for `model` at `precision` (a mode of models/quantize.py). The hf engine swaps
    the model's Linear layers in place; the native engine copies the weights it needs and, with
    `compile`, runs its decoder stack under torch.compile (engine/compile.py), with `graphs`
    its decode steps in fixed shapes (engine/static.py: CUDA graphs on a GPU). model: torch
    weights, or for engine=llamacpp the model's resolved source (`models.loader.ModelSource`).
    `kernels` (base.KERNELS) is the block policy of native's static step, or llama.cpp's
    kernel setup (llamacpp.py); eager native steps and engine=hf have no choice to make."""
    if device not in DEVICES:
        raise SpecpipeError(f"device={device!r} is not supported. Use one of: {', '.join(DEVICES)}.")
    if graphs not in GRAPHS:
        raise SpecpipeError(f"graphs={graphs!r} is not a choice. Use one of: {', '.join(GRAPHS)}.")
    if kernels not in KERNELS:
        raise SpecpipeError(f"kernels={kernels!r} is not a choice. Use one of: {', '.join(KERNELS)}.")
    if engine == "llamacpp":
        if graphs == "on":
            raise SpecpipeError("graphs=on needs engine=native; llama.cpp runs its own kernels. Drop graphs=on.")
        return _llamacpp(model, cache_len, device, compile, kernels)
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecpipeError("device=cuda was asked for but torch sees no CUDA GPU here. Use device=cpu.")
    if pick_engine(model, engine, precision) == "native":
        from specpipe.engine.native import DEFAULT_CACHE_LEN, NativeRunner

        return NativeRunner(model, precision, cache_len or DEFAULT_CACHE_LEN, device, compile=compile,
                            static=static_step(graphs, device), exact=kernels == "exact")
    if compile:
        raise SpecpipeError("compile=true needs the native engine (its families: `specpipe models`); use "
                            "engine=native or drop compile.")
    if graphs == "on":
        raise SpecpipeError("graphs=on needs the native engine (its families: `specpipe models`); use "
                            "engine=native or drop graphs=on.")
    if device != "cpu":
        raise SpecpipeError("device=cuda needs the native engine (its families: `specpipe models`); engine=hf "
                            "runs on the CPU.")
    from specpipe.engine.hf import HFRunner

    return HFRunner(model, precision)


def _llamacpp(source, cache_len: int | None, device: str, compile: bool, kernels: str) -> Runner:
    from specpipe.engine.llamacpp import load_gguf_runner
    from specpipe.engine.native import DEFAULT_CACHE_LEN

    if device != "cpu" or compile:
        raise SpecpipeError("engine=llamacpp runs on the CPU with llama.cpp's own kernels: drop device=cuda and "
                            "compile=true, or use engine=native.")
    if isinstance(source, torch.nn.Module):
        raise SpecpipeError("engine=llamacpp loads a GGUF file itself and cannot run torch weights; pass the "
                            "model's source (a zoo name or a .gguf file), or use engine=native.")
    return load_gguf_runner(source, cache_len=cache_len or DEFAULT_CACHE_LEN, kernels=kernels)
