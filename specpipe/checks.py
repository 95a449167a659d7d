"""Compatibility checks, run before any weights load (and by `specpipe check`).

Each check returns `Check(name, status, why, fix)` with status ok / warn / refuse / n/a.
`build_pipeline` refuses a configuration with any `refuse`; `specpipe check` prints them all.
Only tokenizers are loaded here (for the draft's vocabulary), never weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from specpipe.errors import SpecpipeError
from specpipe.models.quantize import GUARANTEE, MODES, NATIVE_ONLY, TARGET_SAFE


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | refuse | n/a
    why: str
    fix: str = ""


def kind_of(node: DictConfig) -> str:
    """A component's short name, from its build function (specpipe.proposers.ngram.build -> ngram)."""
    target = node.get("_target_") or "none"
    return target.split(".")[-2] if "." in target else target


def proposer_kind(cfg: DictConfig) -> str:
    return kind_of(cfg.proposer)


def lora_paths(cfg: DictConfig) -> list[str]:
    lora = cfg.model.get("lora")
    if lora is None:
        return []
    return [str(lora)] if isinstance(lora, str) else [str(p) for p in lora]


def check_early_exit(cfg: DictConfig) -> Check:
    layers = cfg.model.get("early_exit")
    if layers is None:
        return Check("early exit", "n/a", "the target runs all its layers")
    if proposer_kind(cfg) != "none":
        return Check("early exit", "refuse",
                     f"model.early_exit={layers} and speculative decoding both cut the cost of decode "
                     "steps; their gains do not stack, and an early-exit target changes what the draft "
                     "is verified against.", "drop model.early_exit, or use proposer=none")
    return Check("early exit", "ok", f"the target exits after layer {layers} (plain decoding)")


def check_lora(cfg: DictConfig) -> Check:
    paths, kind = lora_paths(cfg), proposer_kind(cfg)
    if not paths:
        return Check("LoRA", "n/a", "no adapter on the target")
    if len(paths) > 1:
        if kind in ("draft", "twin"):
            return Check("LoRA", "refuse",
                         f"{len(paths)} adapters switched per request: a {kind} proposer built without "
                         "them drafts for the base model, not the adapted target.",
                         "merge one adapter (model.lora=PATH), or use proposer=ngram")
        return Check("LoRA", "ok", f"{len(paths)} adapters, switched per request; {kind} needs no weights")
    if kind == "draft":
        return Check("LoRA", "warn",
                     "the adapter is merged into the target, but the independent draft was trained on "
                     "the base model: expect lower acceptance.", "fine-tune the draft with the same data")
    return Check("LoRA", "ok", "the adapter is merged into the target before the twin is built "
                 "(merge, then quantize)" if kind == "twin" else "the adapter is merged into the target")


def check_precision(cfg: DictConfig) -> list[Check]:
    checks = []
    mode = cfg.model.quantize
    if mode not in MODES:
        status, why = "refuse", f"model.quantize={mode} is not a known precision"
    elif mode not in TARGET_SAFE:
        status = "refuse"
        why = (f"model.quantize={mode} computes a verify block differently from one-token steps (one "
               "activation scale per call): speculative output would drift from plain decoding")
    else:
        status, why = "ok", f"target weights {mode} ({GUARANTEE[mode]}): verify rows equal one-token rows"
    checks.append(Check("target precision", status, why, f"use one of {', '.join(TARGET_SAFE)}"))
    draft_mode = cfg.proposer.get("quantize")
    if draft_mode is not None:
        ok = draft_mode in MODES
        checks.append(Check("draft precision", "ok" if ok else "refuse",
                            f"proposer.quantize={draft_mode}: " + (
                                "any precision is safe for a draft, the target verifies it" if ok
                                else "not a known precision"), f"use one of {', '.join(MODES)}"))
    return checks


def check_sampling(cfg: DictConfig) -> Check:
    name = kind_of(cfg.verifier)
    if name == "greedy" and cfg.temperature > 0:
        return Check("sampling", "refuse", f"verifier=greedy cannot honour temperature={cfg.temperature}",
                     "use verifier=rejection, or temperature=0")
    if name == "rejection" and cfg.proposer.get("tree"):
        return Check("sampling", "refuse", "verifier=rejection verifies chains, and proposer.tree drafts a tree",
                     "use proposer.tree=null, or verifier=greedy / verifier=typical with the tree")
    if name == "typical":
        return Check("sampling", "warn", "verifier=typical is LOSSY: with temperature > 0 the output is not "
                     "distributed as the target's (at temperature 0 it keeps the target's argmax tokens)",
                     "use verifier=rejection for lossless sampling")
    if name == "greedy" and (cfg.top_k or cfg.top_p < 1.0):
        return Check("sampling", "warn", "top_k / top_p have no effect on greedy decoding")
    return Check("sampling", "ok", f"verifier={name} honours temperature={cfg.temperature}, "
                 f"top_k={cfg.top_k}, top_p={cfg.top_p} identically on target and draft")


def check_tokenizer(cfg: DictConfig, target_tokenizer_loader, draft_tokenizer_loader) -> Check:
    if proposer_kind(cfg) != "draft":
        return Check("tokenizer", "ok", f"proposer={proposer_kind(cfg)} uses the target's own tokenizer")
    try:
        check_same_tokenizer(target_tokenizer_loader(), draft_tokenizer_loader(), cfg.model.name,
                             cfg.proposer.model)
    except SpecpipeError as err:
        return Check("tokenizer", "refuse", str(err), "pick a draft from the target's family")
    return Check("tokenizer", "ok", "draft and target share vocabulary, token strings and EOS")


def check_engine(cfg: DictConfig, target_config) -> list[Check]:
    """Which engine runs the target, the guarantee its precision gives, and the device."""
    from specpipe.engine import DEVICES, ENGINES
    from specpipe.engine.native_model import config_unsupported_reason

    engine, mode = cfg.engine, cfg.model.quantize
    if engine not in ENGINES:
        return [Check("engine", "refuse", f"engine={engine} is not an engine", f"use one of {', '.join(ENGINES)}")]
    reason = config_unsupported_reason(target_config) if target_config is not None else "its config is unknown"
    if len(lora_paths(cfg)) > 1:
        reason = "adapters switched per request need the peft model"
    if engine == "native" and reason:
        return [Check("engine", "refuse", f"engine=native cannot run {cfg.model.name}: {reason}", "use engine=auto or hf")]
    native = engine == "native" or (engine == "auto" and not reason)
    if not native and mode in NATIVE_ONLY:
        return [Check("engine", "refuse", f"model.quantize={mode} needs the native engine (bf16 activations end to "
                      f"end); {cfg.model.name} runs on hf: {reason or 'engine=hf was asked for'}",
                      "use model.quantize=fp16 or none")]
    checks = [Check("engine", "ok", (
        f"native: own forward (fused projections, preallocated KV cache of {cfg.cache_len} slots indexed by "
        f"position){', decoder stack compiled' if cfg.get('compile') else ''}" if native
        else f"hf: transformers eager on a DynamicCache ({reason or 'engine=hf'})"))]
    guarantee = GUARANTEE.get(mode, "")
    if mode in TARGET_SAFE:
        checks.append(Check("verify guarantee", "ok", {
            "exact": f"{mode}: every row of a verify block is bitwise equal to a one-token forward (greedy "
                     "speculative output = plain output, bit for bit)",
            "tolerance": f"{mode}: verify rows equal one-token rows to ~1e-5; a near-tie (top-2 logits within "
                         "~1e-4) can flip"}[guarantee]))
    if cfg.device not in DEVICES:
        checks.append(Check("device", "refuse", f"device={cfg.device} is not supported", f"use {' or '.join(DEVICES)}"))
    elif cfg.device == "cuda":
        import torch

        ok = torch.cuda.is_available() and native and mode in ("none", "bf16")
        checks.append(Check("device", "ok" if ok else "refuse", "cuda: native engine, dense kernels" if ok else
                            "device=cuda needs a visible CUDA GPU, the native engine and model.quantize=bf16 or none "
                            "(fbgemm kernels are CPU-only)", "use device=cpu, or model.quantize=bf16"))
    return checks


def check_memory(cfg: DictConfig, target_config, draft_config_loader) -> Check:
    """What the target, a draft model and their KV caches will take (estimated from configs)."""
    from specpipe.engine.footprint import cache_bytes, mib, weight_bytes

    if target_config is None:
        return Check("memory", "n/a", "the target's config is unknown")
    tokens, rows = cfg.cache_len, batch_size(cfg)
    slots = f"{tokens} slots" + (f" × {rows} rows" if rows > 1 else "")
    parts = [f"target {mib(weight_bytes(target_config, cfg.model.quantize))} + KV cache "
             f"{mib(rows * cache_bytes(target_config, cfg.model.quantize, tokens))} ({slots})"]
    kind = proposer_kind(cfg)
    draft_mode = cfg.proposer.get("quantize", "none")
    try:
        draft = draft_config_loader() if kind == "draft" else target_config if kind == "twin" else None
    except SpecpipeError:  # an unreachable draft: the tokenizer check has said so already
        draft = None
    if draft is not None:
        parts.append(f"{kind} {mib(weight_bytes(draft, draft_mode))} + KV cache "
                     f"{mib(rows * cache_bytes(draft, draft_mode, tokens))}")
    elif kind in HEAD_PROPOSERS:
        parts.append(f"{kind} heads: see bench's measured figures (their size is in the heads folder)")
    return Check("memory", "ok", "estimated: " + "; ".join(parts), "lower cache_len= to shrink the caches")


def check_heads(cfg: DictConfig, target_config_loader) -> Check:
    """Heads trained for another hidden size, vocabulary or target are refused by name."""
    kind = proposer_kind(cfg)
    if kind not in HEAD_PROPOSERS:
        return Check("heads", "n/a", f"proposer={kind} uses no trained heads")
    from omegaconf import OmegaConf

    from specpipe.heads.io import read_config

    if OmegaConf.is_missing(cfg.proposer, "heads"):
        return Check("heads", "refuse", f"proposer={kind} needs proposer.heads=DIR (trained heads)",
                     f"train some: specpipe train proposer={kind} model={cfg.model.name}; or use a recipe that "
                     f"ships them: recipe=recipes/smollm2-135m/{kind}.yaml")
    try:
        heads = read_config(cfg.proposer.heads, kind)
    except SpecpipeError as err:
        return Check("heads", "refuse", str(err), f"train heads: specpipe train proposer={kind} model={cfg.model.name}")
    target = target_config_loader()
    problems = [f"{what} {heads.get(key)} vs the target's {getattr(target, key, None)}"
                for what, key in (("hidden size", "hidden_size"), ("vocabulary", "vocab_size"))
                if heads.get(key) != getattr(target, key, None)]
    trained_for = heads.get("specpipe", {}).get("target")
    if problems:
        return Check("heads", "refuse", f"the {kind} heads in {cfg.proposer.heads} do not fit {cfg.model.name}: "
                     + "; ".join(problems), f"train heads for this target: specpipe train proposer={kind} "
                     f"model={cfg.model.name}")
    if trained_for and trained_for != cfg.model.name:
        return Check("heads", "refuse", f"the {kind} heads in {cfg.proposer.heads} were trained on {trained_for}, "
                     f"not {cfg.model.name} (same shapes, other features: they would guess blindly)",
                     f"use heads trained on {cfg.model.name}, or model={trained_for}")
    return Check("heads", "ok", f"{kind} heads trained on {trained_for or 'an unnamed target'}, shapes match")


HEAD_PROPOSERS = ("medusa", "eagle")


def batch_size(cfg: DictConfig) -> int:
    """Sequences decoding at once: bench's concurrency, generate's batch (0: its prompts, at least 1)."""
    return max(int(cfg.get("concurrency") or 1), int(cfg.get("batch") or 1))


def check_batch(cfg: DictConfig, target_config, draft_config_loader) -> Check:
    """Whether this composition decodes several sequences in one forward, and its batch schedule.
    (The same rules as `Pipeline.batch_refusal`, read from configs.)"""
    from specpipe.controllers.base import check_schedule
    from specpipe.engine.native_model import config_unsupported_reason

    try:
        schedule = check_schedule(cfg.get("batch_schedule"))
    except SpecpipeError as err:
        return Check("batch", "refuse", str(err).rstrip("."), "fix batch_schedule=")
    kind, size = proposer_kind(cfg), batch_size(cfg)
    native = cfg.engine != "hf" and target_config is not None and not config_unsupported_reason(target_config)
    reason = None if native else "the target runs on the hf engine, which has no batch rows"
    if reason is None and kind in HEAD_PROPOSERS and cfg.proposer.get("tree"):
        reason = f"proposer.tree: a {kind} tree's mask differs per row, which the batched forward does not take yet"
    if reason is None and kind == "draft":
        try:
            draft = draft_config_loader()
        except SpecpipeError:
            draft = None
        if draft is not None and config_unsupported_reason(draft):
            reason = "the draft model runs on the hf engine, which decodes one sequence at a time"
    plan = f"; batch_schedule {schedule} (γ per batch size)" if schedule else ""
    if reason is not None:
        return Check("batch", "warn" if size > 1 else "ok", f"one sequence at a time: {reason}{plan}",
                     "use engine=native (auto), and a chain (proposer.tree=null) to batch" if size > 1 else "")
    return Check("batch", "ok", f"{kind} batches: {size} sequence(s) per forward, each with its own KV cache row "
                 f"and acceptance{plan}")


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft model must tokenize exactly like the target: same vocabulary, same specials."""
    problems = []
    if len(target_tok) != len(draft_tok):
        problems.append(f"vocabulary sizes differ ({len(target_tok)} vs {len(draft_tok)})")
    elif target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append("the same ids map to different token strings")
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        problems.append(f"EOS ids differ ({target_tok.eos_token_id} vs {draft_tok.eos_token_id})")
    if problems:
        raise SpecpipeError(
            f"The draft model '{draft_name}' does not share the target '{target_name}''s tokenizer: "
            f"{'; '.join(problems)}. Its token ids would mean different text to the target. Pick a "
            "draft from the target's family (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b), or "
            "a proposer that needs no second model: proposer=twin."
        )


def run_checks(cfg: DictConfig, target_tokenizer_loader, draft_tokenizer_loader,
               target_config_loader=lambda: None, draft_config_loader=lambda: None) -> list[Check]:
    target_config = target_config_loader()
    return [
        check_early_exit(cfg),
        check_lora(cfg),
        *check_precision(cfg),
        check_sampling(cfg),
        check_tokenizer(cfg, target_tokenizer_loader, draft_tokenizer_loader),
        check_heads(cfg, lambda: target_config),
        *check_engine(cfg, target_config),
        check_memory(cfg, target_config, draft_config_loader),
        check_batch(cfg, target_config, draft_config_loader),
    ]


def refuse_if_any(checks: list[Check]) -> None:
    for check in checks:
        if check.status == "refuse":
            fix = f" Fix: {check.fix}." if check.fix else ""
            raise SpecpipeError(f"{check.name}: {check.why.rstrip('.')}.{fix}")
