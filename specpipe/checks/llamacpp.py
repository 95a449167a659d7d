"""Rules for `engine=llamacpp`: what runs on llama.cpp's kernels, and the guarantee it gives here.

They take the place of the precision, engine, adapter and memory rules of target.py: the GGUF's
own quantization runs (model.quantize does not apply), peft adapters and early exit need torch
weights, only the final norm's output can be read (EAGLE-3's three layers cannot), and trees are
drafted as their best path. Whether a verify block's rows equal one-token evaluations depends on
the kernels ggml picks on this CPU, so it is measured (`engine.llamacpp.probe_exact`) once per
file, library and machine, and remembered in the specpipe cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from specpipe.checks.identity import kind_of
from specpipe.checks.result import Check
from specpipe.engine.llamacpp import hidden_refusal, twin_refusal
from specpipe.errors import SpecpipeError
from specpipe.settings import Settings


def check_llamacpp(cfg: DictConfig, s: Settings) -> list[Check]:
    """cfg: for the proposer's options and the controller's γ."""
    from specpipe.engine import library_refusal

    library = _version()
    gguf = _gguf(s.model)
    # what the settings alone refuse is said with or without the library: installing it (minutes)
    # must not be the first of several fixes a user learns one at a time
    checks = [_engine(s, library, gguf), _precision(s, gguf), *_proposer(cfg, s)]
    missing = library_refusal()  # the engine's rule, the one `make_runner` raises
    if missing is not None:
        checks = [Check.refused("engine", missing), *(check for check in checks if check.status != "n/a")]
    if s.lora or s.early_exit is not None:
        checks.append(Check("engine", "refuse", "model.lora and model.early_exit change torch weights, and "
                            "engine=llamacpp runs the GGUF file as it is", "drop them, or use engine=auto"))
    if library is not None and gguf is not None and gguf.is_file() and checks[0].status == "ok":
        fixed = kind_of(cfg.controller) == "fixed"  # verifies γ + 1 tokens; the others up to gamma_max + 1
        block = (cfg.gamma if fixed else max(cfg.gamma, cfg.gamma_max)) + 1
        checks.append(_guarantee(gguf, s.kernels, block, s.rows))
    elif checks[0].status != "ok":
        checks.append(Check("verify guarantee", "n/a", "measured once the engine check above passes"))
    else:
        checks.append(Check("verify guarantee", "n/a", "measured once the GGUF is on disk (whether ggml's kernels "
                            "give a verify block's rows bitwise equal to one-token evaluations on this CPU)"))
    return checks


def _version() -> str | None:
    try:
        from importlib.metadata import version

        import llama_cpp  # noqa: F401 (importable, not only installed)
    except ImportError:
        return None
    return version("llama_cpp_python")


def _gguf(name: str) -> Path | None:
    """The GGUF file a model name stands for (a zoo name's, fetched or not), or None."""
    from specpipe.models.loader import resolve

    try:
        source = resolve(name, fetch=False)
    except SpecpipeError:
        return None
    return None if source.gguf is None else Path(source.path) / source.gguf


def _engine(s: Settings, library: str | None, gguf: Path | None) -> Check:
    """What the settings refuse first (none of it needs the library); then, with the library, what runs."""
    from specpipe.engine.llamacpp import threads

    if gguf is None:
        return Check("engine", "refuse", f"engine=llamacpp runs GGUF files, and model={s.model} is a model "
                     "directory or hub id", "pass a zoo name or a .gguf file, or use engine=auto")
    from specpipe.engine import choice_refusal, llamacpp_refusal

    # the engine's own rules, the ones `make_runner` raises (engine/__init__.py)
    refusal = choice_refusal("llamacpp", s.graphs, s.kernels) or llamacpp_refusal(s.graphs, s.device, s.compile)
    if refusal is not None:
        return Check.refused("engine", refusal)
    if library is None:  # refused by check_llamacpp, with the install command
        return Check("engine", "n/a", "the settings suit engine=llamacpp")
    how = ("kernels=exact: q8_0 KV cache, weights in the file's layout" if s.kernels == "exact"
           else "kernels=fast: llama.cpp's defaults, f16 KV cache, repacked weights")
    return Check("engine", "ok", f"llamacpp: llama-cpp-python {library}, ggml CPU kernels on {gguf.name} as it is, "
                 f"{threads()} threads, flash attention, {how}, one llama.cpp sequence per row ({s.cache_len} "
                 "slots each)")


def _precision(s: Settings, gguf: Path | None) -> Check:
    from specpipe.models.quantize import GGUF

    mode = s.precision
    if mode not in (GGUF, "none"):
        return Check("target precision", "refuse", f"model.quantize={mode} does not apply to engine=llamacpp: the "
                     "GGUF file's own quantization runs", "drop model.quantize (auto), or use engine=native")
    size = f" ({gguf.stat().st_size / 2**20:,.0f} MiB, memory-mapped)" if gguf is not None and gguf.is_file() else ""
    return Check("target precision", "ok", f"the GGUF's own types{size}; nothing is dequantized")


def _proposer(cfg: DictConfig, s: Settings) -> list[Check]:
    d, kind = s.declaration, s.proposer
    refusal = hidden_refusal(d.hidden == "layers", f"proposer={kind}")
    if refusal is not None:
        return [Check.refused("proposer", refusal)]
    checks = []
    refusal = twin_refusal(cfg.proposer.get("gguf")) if kind == "twin" else None
    if refusal is not None:
        checks.append(Check.refused("proposer", refusal))
    draft = cfg.proposer.get("gguf") if kind == "twin" else s.draft.model
    if draft and _gguf(str(draft)) is None:
        checks.append(Check("proposer", "refuse", f"the draft {draft} is not a GGUF file, and engine=llamacpp runs "
                            "drafts on llama.cpp too", "pass a zoo name or a .gguf file as the draft"))
    if s.tree_option:  # asked for by the user: they should know it does not happen
        checks.append(Check("tree", "warn", f"engine=llamacpp verifies chains: proposer={kind} drafts its tree's best "
                            "path", "drop proposer.tree, or use engine=native for trees"))
    elif s.tree_auto:
        checks.append(Check("tree", "ok", f"engine=llamacpp verifies chains: proposer={kind} drafts its best path"))
    if d.draft_model and s.draft.precision not in (None, "none"):
        checks.append(Check("draft precision", "ok", f"proposer.quantize={s.draft.precision} does not apply: the "
                            "draft's GGUF runs with its own types"))
    return checks


def _guarantee(gguf: Path, kernels: str, block: int, rows: int = 1) -> Check:
    """exact where every evaluation the pipeline can ask for (γ + 1 tokens for each of `rows`
    sequences: one block for ggml's matmuls) was measured bitwise equal to one-token rows."""
    exact_up_to = measured_exact(gguf, kernels)
    tokens = block * rows
    asked = f"{block}" if rows == 1 else f"{block} tokens for each of {rows} rows, {tokens} at once"
    if tokens <= exact_up_to:
        return Check("verify guarantee", "ok", f"exact (measured on this CPU): evaluations of up to {exact_up_to} "
                     f"tokens have rows bitwise equal to one-token evaluations, and this one verifies up to {asked}: "
                     "greedy speculative output = plain output on this engine")
    fix = ("use kernels=exact" if kernels == "fast" and exact_up_to < 2 else
           f"keep γ ≤ {exact_up_to // rows - 1} (gamma, gamma_max)" if exact_up_to // rows >= 2 else
           "decode fewer sequences at once (batch=, concurrency=)" if exact_up_to >= 2 else
           "build llama-cpp-python with `specpipe install llamacpp` (without llamafile's batched kernels), or use "
           "engine=native")
    within = f"evaluations of up to {exact_up_to} tokens are exact here, and " if exact_up_to >= 2 else ""
    return Check("verify guarantee", "warn", f"tolerance (measured on this CPU): {within}this configuration "
                 f"verifies up to {asked}, which ggml computes with other kernels than one-token steps (logits "
                 "differ by up to ~1): a near-tie can flip, and `specpipe bench` reports every output that differs "
                 "from plain decoding", fix)


def measured_exact(gguf: Path, kernels: str) -> int:
    """`probe_exact` (the largest exact block) for this file, kernels, llama-cpp-python build and
    CPU, from the cache or measured now."""
    from specpipe.engine.llamacpp import PROBE_TOKENS, LlamaCppRunner, probe_exact
    from specpipe.machine import cpu_features, cpu_name
    from specpipe.models import zoo

    stat = gguf.stat()
    build = Path(llama_cpp_library()).stat().st_mtime_ns  # a rebuild with other flags is measured again
    key = (f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{kernels}:{_version()}:{build}:{cpu_name()}:"
           f"{','.join(cpu_features())}:{PROBE_TOKENS}")
    record = zoo.cache_root() / "llamacpp-exact-blocks.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = probe_exact(LlamaCppRunner(gguf, cache_len=600 + PROBE_TOKENS, kernels=kernels))
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(record)
        except OSError:  # a read-only cache: measured again next time
            pass
    return int(known[key])


def llama_cpp_library() -> str:
    """The path of the compiled llama-cpp-python module's package (what a rebuild replaces)."""
    import llama_cpp

    return llama_cpp.__file__
