"""Runners: one model and its KV cache behind one interface (base.py), three engines.

`make_runner(model, engine=..., precision=...)` is the only place that picks one: `native`
(native.py, the families of native_families.py), `hf` (hf.py, any transformers model), `auto` (native
where the architecture is supported, hf otherwise), or `llamacpp` (llamacpp.py: the model's
GGUF file on llama.cpp's CPU kernels; `model` is then the resolved source, not torch weights).
"""

from __future__ import annotations

import os

import torch

from specpipe.engine.base import FINAL, KERNELS, Memory, Runner, Tail, TailInputs, TargetOutput
from specpipe.errors import Refusal, SpecpipeError, refuse

ENGINES = ("auto", "native", "hf", "llamacpp")
DEVICES = ("cpu", "cuda")
GRAPHS = ("auto", "on", "off")  # engine=native's static step (engine/static.py); auto: on where device=cuda

__all__ = ["DEVICES", "ENGINES", "FINAL", "GRAPHS", "KERNELS", "Memory", "Refusal", "Runner", "Tail", "TailInputs",
           "TargetOutput", "choice_refusal", "device_refusal", "library_refusal", "llamacpp_refusal", "make_runner",
           "native_chosen", "native_refusal", "pick_engine", "refuse", "static_step"]


def static_step(graphs: str, device: str) -> bool:
    """Whether `graphs=` means the static step on `device` (auto: on CUDA only)."""
    return graphs == "on" or (graphs == "auto" and device == "cuda")


def choice_refusal(engine: str, graphs: str = "auto", kernels: str = "exact") -> Refusal | None:
    """engine=, graphs= or kernels= set to a value that is none of its choices."""
    if engine not in ENGINES:
        return Refusal(f"engine={engine} is not an engine", f"use one of {', '.join(ENGINES)}")
    if graphs not in GRAPHS:
        return Refusal(f"graphs={graphs} is not a choice: graphs is one of {', '.join(GRAPHS)}",
                       "use graphs=auto (the default: static steps where device=cuda)")
    if kernels not in KERNELS:
        return Refusal(f"kernels={kernels} is not a choice: kernels is one of {', '.join(KERNELS)}",
                       "use kernels=exact (the default: verify rows bitwise equal plain rows) or kernels=fast")
    return None


def native_chosen(engine: str, reason: str | None) -> bool:
    """Whether `engine=` (not llamacpp) runs the model natively; reason: why the native engine
    cannot run it (`native_model.unsupported_reason`), or None."""
    return engine == "native" or (engine == "auto" and not reason)


def native_refusal(engine: str, reason: str | None, precision: str, *, graphs: str = "auto", compile: bool = False,
                   model: str = "this model") -> Refusal | None:
    """What needs the native engine where it does not run the model: engine=native itself, a
    precision of the native engine alone, graphs=on, compile=true. model: its name in the sentence."""
    from specpipe.models.quantize import NATIVE_ONLY

    if engine == "native" and reason:
        return Refusal(f"engine=native cannot run {model}: {reason}", "use engine=auto or hf")
    if native_chosen(engine, reason):
        return None
    on_hf = f"{model} runs on hf: {reason or 'engine=hf was asked for'}"
    if precision in NATIVE_ONLY:
        return Refusal(f"precision {precision} needs the native engine (bf16 activations end to end); {on_hf}",
                       "use fp16 or none" + ("" if reason else ", or engine=native"))
    if graphs == "on":
        return Refusal(f"graphs=on needs the native engine; {on_hf}", "drop graphs=on, or use engine=native")
    if compile:
        return Refusal(f"compile=true needs the native engine; {on_hf}", "drop compile, or use engine=native")
    return None


def device_refusal(device: str, native: bool = True, reason: str | None = None,
                   model: str = "this model") -> Refusal | None:
    """device= that is not a device, a GPU torch does not see (and what hides it), or device=cuda
    for a model that runs on hf (a GPU is not brought by a precision, nor a precision by a GPU)."""
    if device not in DEVICES:
        return Refusal(f"device={device} is not supported", f"use {' or '.join(DEVICES)}")
    if device != "cuda":
        return None
    if not torch.cuda.is_available():
        return _no_gpu()
    if not native:
        return Refusal(f"device=cuda runs the native engine, and {model} runs on hf: "
                       f"{reason or 'engine=hf was asked for'}", "drop engine=hf (engine=auto), or use device=cpu")
    return None


def _no_gpu() -> Refusal:
    """device=cuda where torch sees no GPU: a torch without CUDA, or a GPU it cannot see."""
    if torch.version.cuda is None:
        return Refusal(f"device=cuda, but this torch ({torch.__version__}) is built without CUDA",
                       "use device=cpu (the default), or on a machine with an NVIDIA GPU install a CUDA build of torch "
                       "(https://pytorch.org/get-started/locally/ gives the command for its CUDA version)")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return Refusal("device=cuda, but torch sees no CUDA GPU on this machine"
                   + (f" (CUDA_VISIBLE_DEVICES={hidden!r} hides them)" if hidden is not None else
                      " (no NVIDIA GPU, or its driver is not loaded: `nvidia-smi` says which)"),
                   "use device=cpu (the default)" + (", or unset CUDA_VISIBLE_DEVICES" if hidden is not None else
                                                     ", or run on a machine whose GPU `nvidia-smi` lists"))


def llamacpp_refusal(graphs: str, device: str, compile: bool) -> Refusal | None:
    """What engine=llamacpp does not take: the native engine's static step, a GPU, compile."""
    if graphs not in ("auto", "off"):  # auto is off here
        return Refusal(f"graphs={graphs} sets engine=native's static decode step, and llama.cpp runs its own kernels",
                       "drop graphs=, or use engine=native")
    if device != "cpu" or compile:
        return Refusal("engine=llamacpp runs on the CPU with llama.cpp's own kernels (device=cuda and compile=true "
                       "do not apply)", "use device=cpu without compile, or engine=native")
    return None


def library_refusal() -> Refusal | None:
    """engine=llamacpp where llama-cpp-python cannot be imported (`specpipe install llamacpp` builds it)."""
    try:
        import llama_cpp  # noqa: F401 (importable, not only installed)
    except ImportError:
        from specpipe.engine.llamacpp import INSTALL, PINNED

        return Refusal("engine=llamacpp needs llama-cpp-python, which is not installed",
                       f"run `{INSTALL}` (builds llama-cpp-python {PINNED} for this CPU, a few minutes), or use "
                       "engine=auto")
    return None


def pick_engine(model: torch.nn.Module, engine: str = "auto", precision: str = "none") -> str:
    """The engine `engine=` means for this model ('native', 'hf' or 'llamacpp'), or a SpecpipeError."""
    refuse(choice_refusal(engine))
    if engine == "llamacpp":
        return engine
    reason = _unsupported(model)
    refuse(native_refusal(engine, reason, precision))
    return "native" if native_chosen(engine, reason) else "hf"


def make_runner(model, *, engine: str = "auto", precision: str = "none", cache_len: int | None = None,
                device: str = "cpu", compile: bool = False, kernels: str = "exact", graphs: str = "auto") -> Runner:
    """A runner for `model` at `precision` (a mode of models/quantize.py). The hf engine swaps
    the model's Linear layers in place; the native engine copies the weights it needs and, with
    `compile`, runs its decoder stack under torch.compile (engine/compile.py), with `graphs`
    its decode steps in fixed shapes (engine/static.py: CUDA graphs on a GPU). model: torch
    weights, or for engine=llamacpp the model's resolved source (`models.loader.ModelSource`).
    `kernels` (base.KERNELS) is the block policy of native's static step, or llama.cpp's
    kernel setup (llamacpp.py); eager native steps and engine=hf have no choice to make.
    Its refusals are the rules above, which `specpipe check` reports from the configuration."""
    refuse(choice_refusal(engine, graphs, kernels))
    if engine == "llamacpp":
        refuse(llamacpp_refusal(graphs, device, compile) or device_refusal(device) or library_refusal())
        return _llamacpp(model, cache_len, kernels)
    reason = _unsupported(model)
    native = native_chosen(engine, reason)
    refuse(native_refusal(engine, reason, precision, graphs=graphs, compile=compile)
           or device_refusal(device, native, reason))
    if native:
        from specpipe.engine.native import DEFAULT_CACHE_LEN, NativeRunner

        return NativeRunner(model, precision, cache_len or DEFAULT_CACHE_LEN, device, compile=compile,
                            static=static_step(graphs, device), exact=kernels == "exact")
    from specpipe.engine.hf import HFRunner

    return HFRunner(model, precision)


def _unsupported(model: torch.nn.Module) -> str | None:
    from specpipe.engine.native_model import unsupported_reason

    return unsupported_reason(model)


def _llamacpp(source, cache_len: int | None, kernels: str) -> Runner:
    from specpipe.engine.llamacpp import load_gguf_runner
    from specpipe.engine.native import DEFAULT_CACHE_LEN

    if isinstance(source, torch.nn.Module):
        raise SpecpipeError("engine=llamacpp loads a GGUF file itself and cannot run torch weights; pass the "
                            "model's source (a zoo name or a .gguf file), or use engine=native.")
    return load_gguf_runner(source, cache_len=cache_len or DEFAULT_CACHE_LEN, kernels=kernels)
