"""Rules about the target: early exit, adapters, precision, engine and device, memory."""

from __future__ import annotations

from specpipe.checks.result import Check
from specpipe.limits import memory_problem
from specpipe.models.adapters import early_exit_refusal, lora_refusal
from specpipe.models.quantize import (BY_DEVICE, MODES, TARGET_SAFE, cuda_refusal, guarantee, kernel_name,
                                      kernel_refusal)
from specpipe.settings import Settings


def check_early_exit(s: Settings) -> Check:
    layers = s.early_exit
    if layers is None:
        return Check("early exit", "n/a", "the target runs all its layers")
    refusal = early_exit_refusal(layers, getattr(s.target_config, "num_hidden_layers", None))
    if refusal is not None:
        return Check.refused("early exit", refusal)
    if s.proposer != "none":
        return Check("early exit", "refuse",
                     f"model.early_exit={layers} and speculative decoding both cut the cost of decode "
                     "steps; their gains do not stack, and an early-exit target changes what the draft "
                     "is verified against.", "drop model.early_exit, or use proposer=none")
    return Check("early exit", "ok", f"the target exits after layer {layers} (plain decoding)")


def check_lora(s: Settings) -> Check:
    paths, kind, second = s.lora, s.proposer, s.declaration.draft_model
    if not paths:
        return Check("LoRA", "n/a", "no adapter on the target")
    refusal = lora_refusal(paths)
    if refusal is not None:
        return Check.refused("LoRA", refusal)
    if len(paths) > 1:
        if second is not None:
            return Check("LoRA", "refuse",
                         f"{len(paths)} adapters switched per request: a {kind} proposer built without "
                         "them drafts for the base model, not the adapted target.",
                         "merge one adapter (model.lora=PATH), or use proposer=ngram")
        return Check("LoRA", "ok", f"{len(paths)} adapters, switched per request; {kind} needs no weights")
    if second not in (None, "target"):
        return Check("LoRA", "warn",
                     "the adapter is merged into the target, but the independent draft was trained on "
                     "the base model: expect lower acceptance.", "fine-tune the draft with the same data")
    return Check("LoRA", "ok", "the adapter is merged into the target before the twin is built "
                 "(merge, then quantize)" if second == "target" else "the adapter is merged into the target")


def check_precision(s: Settings) -> list[Check]:
    checks = []
    mode = s.precision
    if mode not in MODES:
        status, why = "refuse", f"model.quantize={mode} is not a known precision"
    elif mode not in TARGET_SAFE:
        status = "refuse"
        why = (f"model.quantize={mode} computes a verify block differently from one-token steps (one "
               "activation scale per call): speculative output would drift from plain decoding")
    elif s.device == "cpu" and kernel_refusal(mode) is not None:
        status, why = "refuse", None
    else:
        status, why = "ok", f"target weights {mode} ({guarantee(mode)}): verify rows equal one-token rows"
    checks.append(Check.refused("target precision", kernel_refusal(mode)) if why is None else
                  Check("target precision", status, why, f"use one of {', '.join(TARGET_SAFE)}"))
    draft_mode = s.draft.precision
    if draft_mode is not None:
        ok = draft_mode in MODES
        checks.append(Check("draft precision", "ok" if ok else "refuse",
                            f"proposer.quantize={draft_mode}: " + (
                                "any precision is safe for a draft, the target verifies it" if ok
                                else "not a known precision"), f"use one of {', '.join(MODES)}"))
    return checks


def check_engine(s: Settings) -> list[Check]:
    """Which engine runs the target, how its decode steps run, the guarantee they give, and the
    device: the engine and the static step as the settings resolved them, judged by the engine's
    own rules (engine/__init__.py), the ones `make_runner` raises."""
    from specpipe.engine import choice_refusal, device_refusal, native_refusal

    mode, graphs, kernels, reason = s.precision, s.graphs, s.kernels, s.engine_reason
    refusal = choice_refusal(s.engine_choice, graphs, kernels) or native_refusal(
        s.engine_choice, reason, mode, graphs=graphs, compile=s.compile, model=s.model)
    if refusal is not None:
        return [Check.refused("engine", refusal)]
    native, static, slots = s.native, s.static, s.slots
    lowered = f"; cache_len={s.cache_len} is past the model's positions: {slots} are allocated" if slots < s.cache_len else ""
    checks = [Check("engine", "ok", (
        f"native{_family_of(s.target_config)}: own forward (fused projections, preallocated KV cache of {slots} "
        f"slots indexed by position){', decoder stack compiled' if s.compile else ''}{lowered}; "
        + _step_of(s.device, static, kernels) if native
        else f"hf: transformers eager on a DynamicCache ({reason or 'engine=hf'})"))]
    if mode == BY_DEVICE.get(s.device):
        checks.append(Check("precision", "ok", f"{mode}: the {s.device} default (model.quantize=auto picks fp16 "
                            "weights on the CPU, bf16 on CUDA, on the fastest kernel each device runs; a model read "
                            "from a 4-bit GGUF file runs w4a8 on the CPU, on its own 4-bit grid)"))
    if mode in TARGET_SAFE:
        checks.append(Check("kernel", "ok", f"{mode}: {kernel_name(mode, s.device, native)}"))
        checks.append(_guarantee(mode, s.device, static, kernels, native, trees=s.tree_option or s.tree_auto))
    if kernels == "fast" and not static:  # the key is shared with engine=llamacpp: say where it bites
        checks.append(Check("kernels", "n/a", "kernels=fast changes nothing here: it sets the static step's block "
                            "policy (engine=native with graphs=on, the default on cuda) and llama.cpp's kernels "
                            "(engine=llamacpp); these decode steps run eagerly, with the precision's guarantee",
                            "drop kernels=fast" + (", or add graphs=on" if native else "")))
    if static and kernels == "exact" and (s.tree_option or s.tree_auto):
        checks.append(Check("tree", "warn" if s.tree_option else "ok",
                            f"graphs with kernels=exact verify chains: proposer={s.proposer} drafts its best "
                            "path (a tree's siblings share a position, so they cannot each run at their plain step's "
                            "block row)", "kernels=fast verifies the tree, within tolerance"))
    if s.overlapped:
        checks.append(Check("overlap", "ok", "plain steps (plain decoding, and the steps the guard holds at γ 0) are "
                            "queued on the device before the last one's tokens are read: the host's work between "
                            "steps runs beside the device's" + ("" if s.device == "cuda" else
                                                               " (on the CPU, which computes as it is asked, "
                                                               "nothing to gain)")))
    refusal = device_refusal(s.device, native, reason, s.model)
    if refusal is not None:
        checks.append(Check.refused("device", refusal))
    elif s.device == "cuda":
        checks.append(_cuda_precision(mode))
    return checks


def _cuda_precision(mode: str) -> Check:
    """device=cuda on a GPU torch sees, natively: whether the precision has CUDA kernels."""
    refusal = cuda_refusal(mode)
    if refusal is not None:
        return Check.refused("device", refusal)
    return Check("device", "ok", "cuda: native engine, dense kernels")


def _family_of(target_config) -> str:
    """The native family that runs the target, in words (' (Gemma3ForCausalLM)'), or nothing."""
    from specpipe.engine.native_model import native_family

    family = native_family(target_config) if target_config is not None else None
    return f" ({family})" if family else ""


def _step_of(device: str, static: bool, kernels: str) -> str:
    """How the native engine's decode steps run (engine/static.py), in words."""
    if not static:
        return "decode steps eager, in per-step shapes"
    how = ("kernels=exact: plain steps and verify blocks in one padded shape" if kernels == "exact"
           else "kernels=fast: each step padded to the fewest rows")
    graphs = "captured as CUDA graphs and replayed" if device == "cuda" else "run eagerly on the CPU (no capture)"
    return (f"static decode steps (fixed shapes over persistent buffers, attention over the whole cache with "
            f"lengths on the device; {how}), {graphs}; drafts likewise: a draft model's steps, Medusa's heads, "
            "greedy EAGLE drafts")


def _guarantee(mode: str, device: str, static: bool, kernels: str, native: bool = True, trees: bool = False) -> Check:
    """The verify guarantee that runs: the precision's on eager steps, the block policy's on static ones.
    trees: the proposer drafts trees, whose rows attend through a mask on a GPU's eager step (row by
    row only on the CPU, where the parents can be read without a sync): within tolerance there."""
    if device == "cuda" and not static and trees:
        return Check("verify guarantee", "ok", (
            f"tolerance ({mode}, eager, tree drafts): a tree's rows attend through its mask in one call, which "
            "sums in another order than a one-token step; a near-tie (top-2 logits within ~1e-4) can flip"),
            "draft chains (proposer.tree=null) for the precision's own guarantee")
    if static and kernels == "exact":
        return Check("verify guarantee", "ok", (
            f"exact by construction ({mode}, graphs, kernels=exact): every decode step, plain or verify, runs one "
            "padded shape per pipeline (batch bucket × 1 + the widest γ), each token at the block row of its "
            "position, so a verify row is computed as its plain step's row, bit for bit; plain steps pay for "
            "the padding rows" + (" (tested bitwise on the CPU; not yet on a GPU: docs/gpu.md)" if device == "cuda"
                                  else "")))
    if static:
        return Check("verify guarantee", "ok", (
            f"tolerance ({mode}, graphs, kernels=fast): plain steps one row, verify blocks their own padded "
            "size: verify rows equal plain rows to ~1e-5; a near-tie (top-2 logits within ~1e-4) can flip"),
            "kernels=exact makes it exact (plain steps in the verify blocks' shape)")
    return Check("verify guarantee", "ok", {
        "exact": f"{mode}: every row of a verify block is bitwise equal to a one-token forward (greedy "
                 "speculative output = plain output, bit for bit)",
        "tolerance": f"{mode}: verify rows equal one-token rows to ~1e-5; a near-tie (top-2 logits within "
                     "~1e-4) can flip"}[guarantee(mode, native) if device == "cpu" else _device_guarantee(mode)])


def _device_guarantee(mode: str) -> str:
    """A precision's guarantee on a GPU: bf16's row-count invariance is CUDA's (measured by the GPU check)."""
    return "exact" if mode in ("bf16", "w8a16") else "tolerance"


def check_memory(s: Settings) -> Check:
    """What the target, a draft model and their KV caches will take (estimated from configs)."""
    from specpipe.engine.footprint import cache_bytes, mib, weight_bytes

    target_config, mode = s.target_config, s.precision
    if target_config is None:
        return Check("memory", "n/a", "the target's config is unknown")
    tokens, rows = s.slots, s.rows
    slots = f"{tokens} slots" + (f" × {rows} rows" if rows > 1 else "")
    total = weight_bytes(target_config, mode) + rows * cache_bytes(target_config, mode, tokens)
    parts = [f"target {mib(weight_bytes(target_config, mode))} + KV cache "
             f"{mib(rows * cache_bytes(target_config, mode, tokens))} ({slots})"]
    kind = s.proposer
    draft_mode = s.draft.precision or "none"
    draft = s.draft.config  # None: no second model, or one unreachable (the tokenizer check says so)
    if draft is not None:
        total += weight_bytes(draft, draft_mode) + rows * cache_bytes(draft, draft_mode, tokens)
        parts.append(f"{kind} {mib(weight_bytes(draft, draft_mode))} + KV cache "
                     f"{mib(rows * cache_bytes(draft, draft_mode, tokens))}")
    elif s.declaration.heads:
        parts.append(f"{kind} heads: see bench's measured figures (their size is in the heads folder)")
    too_much = memory_problem(total, s.device)  # refused here, before the allocator fails part way
    if too_much:
        return Check("memory", "refuse", "estimated: " + "; ".join(parts) + f"; {too_much}",
                     "decode fewer sequences at once (batch=, concurrency=) or lower cache_len=")
    return Check("memory", "ok", "estimated: " + "; ".join(parts), "lower cache_len= to shrink the caches")
