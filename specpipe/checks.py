"""Compatibility checks, run before any weights load (and by `specpipe check`).

Each check returns `Check(name, status, why, fix)` with status ok / warn / refuse / n/a.
`build_pipeline` refuses a configuration with any `refuse`; `specpipe check` prints them all.
Only tokenizers are loaded here (for the draft's vocabulary), never weights.
"""

from __future__ import annotations

import importlib
import inspect
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specpipe.errors import SpecpipeError
from specpipe.limits import cache_slots, integer_problems, memory_problem, size_problems
from specpipe.models.quantize import BY_DEVICE, GUARANTEE, MODES, NATIVE_ONLY, TARGET_SAFE
from specpipe.proposers.declaration import Declaration, declaration_of


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | refuse | n/a
    why: str
    fix: str = ""
    translated: bool = False  # tokenizer check: the draft's tokens are translated (it decodes one sequence at a time)


def kind_of(node: DictConfig) -> str:
    """A component's short name, from its build function (specpipe.proposers.ngram.build -> ngram)."""
    target = node.get("_target_") or "none"
    return target.split(".")[-2] if "." in target else target


def proposer_kind(cfg: DictConfig) -> str:
    return declared(cfg).name


def declared(cfg: DictConfig) -> Declaration:
    """What the config's proposer declares of itself (specpipe/proposers/declaration.py)."""
    return declaration_of(cfg.proposer)


def draft_model_name(cfg: DictConfig) -> str | None:
    """The second model a proposer loads (its declared option), or None."""
    option = declared(cfg).draft_model
    return str(cfg.proposer[option]) if option not in (None, "target") else None


def lora_paths(cfg: DictConfig) -> list[str]:
    lora = cfg.model.get("lora")
    if lora is None:
        return []
    return [str(lora)] if isinstance(lora, str) else [str(p) for p in lora]


def check_early_exit(cfg: DictConfig, target_config=None) -> Check:
    layers = cfg.model.get("early_exit")
    if layers is None:
        return Check("early exit", "n/a", "the target runs all its layers")
    total = getattr(target_config, "num_hidden_layers", None)
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1 or (total and layers > total):
        return Check("early exit", "refuse", f"model.early_exit={layers!r} must be a layer count between 1 and the "
                     f"target's {total or 'number of'} layers", f"use model.early_exit=1..{total or 'N'}, or null")
    if proposer_kind(cfg) != "none":
        return Check("early exit", "refuse",
                     f"model.early_exit={layers} and speculative decoding both cut the cost of decode "
                     "steps; their gains do not stack, and an early-exit target changes what the draft "
                     "is verified against.", "drop model.early_exit, or use proposer=none")
    return Check("early exit", "ok", f"the target exits after layer {layers} (plain decoding)")


def check_lora(cfg: DictConfig) -> Check:
    paths, kind, second = lora_paths(cfg), proposer_kind(cfg), declared(cfg).draft_model
    if not paths:
        return Check("LoRA", "n/a", "no adapter on the target")
    missing = [p for p in paths if not (Path(p).expanduser() / "adapter_config.json").is_file()]
    if missing:
        return Check("LoRA", "refuse", f"model.lora={missing[0]} is not a peft adapter directory (no "
                     "adapter_config.json there)", "pass the directory written by `PeftModel.save_pretrained`")
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
    if name == "rejection" and declared(cfg).drafts_tree(cfg.proposer):
        return Check("sampling", "refuse", "verifier=rejection verifies chains, and proposer.tree drafts a tree",
                     "use proposer.tree=null, or verifier=greedy / verifier=typical with the tree")
    if name == "typical":
        return Check("sampling", "warn", "verifier=typical is LOSSY: with temperature > 0 the output is not "
                     "distributed as the target's (at temperature 0 it keeps the target's argmax tokens)",
                     "use verifier=rejection for lossless sampling")
    if name == "greedy" and (cfg.top_k or cfg.top_p < 1.0):
        return Check("sampling", "warn", "top_k / top_p have no effect on greedy decoding")
    declaration = declared(cfg)
    notes = ""
    if cfg.temperature > 0 and not declaration.draft_probs:
        notes += f"; proposer={declaration.name} drafts without probabilities (one-hot: lossless, kept less often)"
    if name == "rejection" and declaration.tree == "auto":
        notes += f"; proposer={declaration.name} drafts its best path (rejection sampling verifies chains)"
    return Check("sampling", "ok", f"verifier={name} honours temperature={cfg.temperature}, "
                 f"top_k={cfg.top_k}, top_p={cfg.top_p} identically on target and draft{notes}")


def check_tokenizer(cfg: DictConfig, target_tokenizer_loader, draft_tokenizer_loader) -> Check:
    """A second model's tokenizer against the target's: equal where the proposer declares `same`;
    where it declares `any`, a different one is translated and the proposer reports how."""
    declaration = declared(cfg)
    if declaration.tokenizer == "target":
        return Check("tokenizer", "ok", f"proposer={declaration.name} uses the target's own tokenizer")
    from specpipe.models import zoo

    draft = draft_model_name(cfg)
    pair = [zoo.ZOO.get(str(name)) for name in (cfg.model.name, draft)]
    known = None not in pair
    if known and pair[0].tokenizer_family == pair[1].tokenizer_family:
        return Check("tokenizer", "ok", f"draft and target share the {pair[0].tokenizer_family} tokenizer (zoo)")
    if declaration.tokenizer == "same" and known:  # known to differ without a download
        return Check("tokenizer", "refuse", f"The draft model '{draft}' does not share the target "
                     f"'{cfg.model.name}''s tokenizer ({pair[1].tokenizer_family} vs {pair[0].tokenizer_family}): its "
                     "token ids would mean different text to the target", "pick a draft from the target's family")
    target_tok, draft_tok = target_tokenizer_loader(), draft_tokenizer_loader()
    if target_tok is not None and draft_tok is not None and same_tokenizer_problems(target_tok, draft_tok) == []:
        return Check("tokenizer", "ok", "draft and target share vocabulary, token strings and EOS")
    if target_tok is None or draft_tok is None:  # not fetched (export): compared when they are
        if known and declaration.vocabulary is not None:  # the zoo says they differ: translated
            return declaration.vocabulary(None, None, cfg.model.name, draft, cfg.temperature)
        return Check("tokenizer", "ok", f"the tokenizers of '{draft}' and '{cfg.model.name}' are compared once both "
                     "are fetched (specpipe check, generate)")
    if declaration.tokenizer == "same" or declaration.vocabulary is None:
        try:
            check_same_tokenizer(target_tok, draft_tok, cfg.model.name, draft)
        except SpecpipeError as err:
            return Check("tokenizer", "refuse", str(err), "pick a draft from the target's family")
    return declaration.vocabulary(target_tok, draft_tok, cfg.model.name, draft, cfg.temperature)


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
    slots = cache_slots(cfg, target_config)
    lowered = f"; cache_len={cfg.cache_len} is past the model's positions: {slots} are allocated" if slots < cfg.cache_len else ""
    checks = [Check("engine", "ok", (
        f"native: own forward (fused projections, preallocated KV cache of {slots} slots indexed by "
        f"position){', decoder stack compiled' if cfg.get('compile') else ''}{lowered}" if native
        else f"hf: transformers eager on a DynamicCache ({reason or 'engine=hf'})"))]
    guarantee = GUARANTEE.get(mode, "")
    if mode == BY_DEVICE.get(cfg.device):
        checks.append(Check("precision", "ok", f"{mode}: the {cfg.device} default (model.quantize=auto picks fbgemm fp16 "
                            "weights on the CPU, bf16 on CUDA: the fastest precision each runs within its guarantee)"))
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
    tokens, rows = cache_slots(cfg, target_config), batch_size(cfg)
    slots = f"{tokens} slots" + (f" × {rows} rows" if rows > 1 else "")
    total = weight_bytes(target_config, cfg.model.quantize) + rows * cache_bytes(target_config, cfg.model.quantize, tokens)
    parts = [f"target {mib(weight_bytes(target_config, cfg.model.quantize))} + KV cache "
             f"{mib(rows * cache_bytes(target_config, cfg.model.quantize, tokens))} ({slots})"]
    kind = proposer_kind(cfg)
    draft_mode = cfg.proposer.get("quantize", "none")
    try:
        second = declared(cfg).draft_model
        draft = target_config if second == "target" else draft_config_loader() if second else None
    except SpecpipeError:  # an unreachable draft: the tokenizer check has said so already
        draft = None
    if draft is not None:
        total += weight_bytes(draft, draft_mode) + rows * cache_bytes(draft, draft_mode, tokens)
        parts.append(f"{kind} {mib(weight_bytes(draft, draft_mode))} + KV cache "
                     f"{mib(rows * cache_bytes(draft, draft_mode, tokens))}")
    elif declared(cfg).heads:
        parts.append(f"{kind} heads: see bench's measured figures (their size is in the heads folder)")
    too_much = memory_problem(total, cfg.device)  # refused here, before the allocator fails part way
    if too_much:
        return Check("memory", "refuse", "estimated: " + "; ".join(parts) + f"; {too_much}",
                     "decode fewer sequences at once (batch=, concurrency=) or lower cache_len=")
    return Check("memory", "ok", "estimated: " + "; ".join(parts), "lower cache_len= to shrink the caches")


def check_heads(cfg: DictConfig, target_config_loader) -> Check:
    """Heads trained for another hidden size, vocabulary or target are refused by name."""
    kind = proposer_kind(cfg)
    if not declared(cfg).heads:
        return Check("heads", "n/a", f"proposer={kind} uses no trained heads")
    from omegaconf import OmegaConf

    from specpipe.heads.integrity import heads_problem, shape_problem
    from specpipe.heads.io import damaged_heads, read_config

    if OmegaConf.is_missing(cfg.proposer, "heads"):
        return Check("heads", "refuse", f"proposer={kind} needs proposer.heads=DIR (trained heads)",
                     f"train some: specpipe train proposer={kind} model={cfg.model.name}; or use a recipe that "
                     f"ships them: recipe=recipes/smollm2-135m/{kind}.yaml")
    read = declared(cfg).read_heads or (lambda folder: read_config(folder, kind))
    try:
        heads = read(cfg.proposer.heads)
    except SpecpipeError as err:
        return Check("heads", "refuse", str(err), f"train heads: specpipe train proposer={kind} model={cfg.model.name}")
    if damaged := heads_problem(cfg.proposer.heads):  # as a model's files are, before anything reads them
        return Check("heads", "refuse", damaged_heads(cfg.proposer.heads, damaged).rstrip("."),
                     f"restore the folder, or train heads: specpipe train proposer={kind} model={cfg.model.name}")
    target = target_config_loader()  # None: not fetched (export), only the trained-for name is compared
    problems = [problem for what, key in (("hidden size", "hidden_size"), ("vocabulary", "vocab_size"))
                if target is not None and (problem := shape_problem(what, key, heads.get(key), target))]
    asked = cfg.proposer.get("num_heads")  # "use the first N": more than there are is refused, not capped
    if isinstance(asked, int) and isinstance(heads.get("num_heads"), int) and asked > heads["num_heads"]:
        problems.append(f"proposer.num_heads={asked}, and the folder holds {heads['num_heads']} heads")
    layers = getattr(target, "num_hidden_layers", None)
    outside = [k for k in heads.get("reads_layers", ()) if layers is not None and not 0 < k <= layers]
    if target is not None and outside:  # 0 would be the embeddings, which no runner hands over
        problems.append(f"it reads the hidden states entering layers {list(heads['reads_layers'])}, and the "
                        f"target's that can be read are 1..{layers} ({layers}: the last layer's output)")
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


def batch_size(cfg: DictConfig) -> int:
    """Sequences decoding at once: bench's concurrency, generate's batch (0: its prompts, at least 1)."""
    return max(int(cfg.get("concurrency") or 1), int(cfg.get("batch") or 1))


def check_proposer(cfg: DictConfig) -> Check:
    """What the proposer declares of itself, in words (the first row of `specpipe check`)."""
    d = declared(cfg)
    if d.name == "none":
        return Check("proposer", "n/a", "plain decoding with the target")
    reads = {"target": "drafts in the target's own token ids", "same": "a second model with the target's tokenizer",
             "any": "a second model, its tokenizer the target's or translated"}[d.tokenizer]
    shape = {"never": "a chain", "option": "a chain, or a tree with proposer.tree",
             "auto": "a tree where the verifier takes one, else its best path"}[d.tree]
    parts = [reads, shape, "with draft probabilities" if d.draft_probs else "one-hot drafts (no probabilities)"]
    if d.hidden != "none":
        parts.append({"last": "reads the target's last hidden states (the LM head's input)",
                      "layers": "reads hidden states of several of the target's layers"}[d.hidden])
    if d.heads:
        parts.append("trained heads" + (" (specpipe train)" if d.trainer else ""))
    parts.append("stops early when a controller asks" if d.early_stop else "ignores a controller's early stop")
    parts.append(f"exports to {', '.join(d.export) or 'no engine'}")
    return Check("proposer", "ok", f"{d.name}: " + "; ".join(parts))


def check_early_stop(cfg: DictConfig) -> Check:
    """A controller that stops drafts early (controller=confidence) needs a proposer that asks it."""
    from specpipe.build import call_target
    from specpipe.controllers.base import Controller

    controller = call_target(cfg.controller, "controller", None)
    if controller is None or type(controller).stop_below is Controller.stop_below:
        return Check("early stop", "n/a", f"controller={kind_of(cfg.controller)} does not stop drafts early")
    declaration = declared(cfg)
    if not declaration.early_stop:
        return Check("early stop", "warn", f"controller={kind_of(cfg.controller)} stops drafts when the drafter's "
                     f"confidence drops, but proposer={declaration.name} never asks it: every draft runs to γ and the "
                     "controller learns nothing", "use controller=fixed, heuristic, band or cost with this proposer")
    return Check("early stop", "ok", f"proposer={declaration.name} stops its drafts where "
                 f"controller={kind_of(cfg.controller)} says")


def check_batch(cfg: DictConfig, target_config, draft_config_loader, translated: bool = False) -> Check:
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
    if reason is None and declared(cfg).drafts_tree(cfg.proposer):
        reason = f"proposer.tree: a {kind} tree's mask differs per row, which the batched forward does not take yet"
    if reason is None and translated:
        reason = "a draft with another tokenizer re-tokenises each sequence's text on its own"
    if reason is None and not declared(cfg).batches:
        reason = f"proposer={kind} drafts one sequence at a time"
    if reason is None and draft_model_name(cfg):
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


OUTPUTS = ("rich", "json", "text")  # generate's output modes


def check_prompts(prompts: list[str]) -> Check:
    if not prompts:
        return Check("prompts", "n/a", "no prompt given (generate uses the config's `prompt`)")
    if not all(prompts):
        return Check("prompts", "refuse", "a prompt is empty", 'pass the text: specpipe generate "your text" (or '
                     "prompt_file=PATH, or - for standard input)")
    return Check("prompts", "ok", f"{len(prompts)} prompt(s), taken verbatim")


def check_settings(cfg: DictConfig) -> Check:
    """The command-level numbers and choices, each against its range: what `generate`, `bench`
    and `export` would refuse, refused here once for all of them."""
    from specpipe.sampling import SamplingParams

    problems = non_finite(cfg)
    at_least = {"max_new_tokens": 1, "cache_len": 1, "batch": 0, "concurrency": 1, "requests": 0, "limit": 0,
                "warmup": 0, "gamma_min": 0, "gamma_max": 1}
    problems += [f"{key}={cfg[key]} must be at least {low}" for key, low in at_least.items()
                 if key in cfg and cfg[key] < low]
    chat = cfg.model.get("chat")
    if chat is not None and not isinstance(chat, bool):
        problems.append(f"model.chat={chat!r} must be true, false or null (null: the template when there is one)")
    if "output" in cfg and cfg.output not in OUTPUTS:
        problems.append(f"output={cfg.output} is not an output mode (use one of {', '.join(OUTPUTS)})")
    if not problems:
        try:
            SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
        except SpecpipeError as err:
            problems.append(str(err).rstrip("."))
    if cfg.get("concurrency", 1) > 1 and cfg.get("requests") == 0:  # else silently ignored
        problems.append(f"concurrency={cfg.concurrency} is the batch of a request load and needs requests=N (a "
                        "per-prompt bench decodes one prompt at a time)")
    problems += _gamma_problems(cfg) + integer_problems(cfg) + size_problems(cfg)
    if problems:
        return Check("settings", "refuse", "; ".join(problems), "fix the values named (see conf/ for the defaults)")
    return Check("settings", "ok", "every number finite and in range")


def _gamma_problems(cfg: DictConfig) -> list[str]:
    """γ within the bounds of the controller that runs: a clamped γ would make the config shown a lie."""
    node = cfg.controller
    if node.get("_target_") is None or "gamma" not in node:
        return []
    gamma, low, high = node.gamma, node.get("gamma_min", 0), node.get("gamma_max", node.gamma)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gamma, low, high)):
        return [f"gamma={gamma!r}, gamma_min={low!r} and gamma_max={high!r} must be integers"]
    if gamma < 1:
        return [f"gamma={gamma} must be at least 1 (γ draft tokens per step; proposer=none for plain decoding)"]
    if not low <= gamma <= high:
        return [f"gamma={gamma} is outside the controller's bounds gamma_min={low} .. gamma_max={high} (raise "
                f"gamma_max={gamma}, or lower gamma)"]
    return []


def non_finite(cfg: DictConfig) -> list[str]:
    """nan / inf anywhere in a config, named by key (train's settings too)."""
    return [f"{key}={value} is not a finite number" for key, value in _floats(cfg) if not math.isfinite(value)]


def _floats(node, prefix: str = ""):
    """(dotted key, value) of every float anywhere in a config: nan / inf hide in component options too."""
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in items:
        name = f"{prefix}{key}" if isinstance(container, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, float):
            yield name, value
        elif isinstance(value, (dict, list)):
            yield from _floats(value, f"{name}.")


def check_options(cfg: DictConfig) -> Check:
    """Each component's options against the types its build function (or the class it builds)
    declares, and the component's own `validate_options` when it has one: `proposer.ngram_max=abc`
    or `proposer.tree=abc` is refused here, before anything loads, not as a traceback mid-build."""
    problems = []
    for group in ("proposer", "verifier", "controller"):
        target = cfg[group].get("_target_")
        if not target:
            continue
        options = OmegaConf.to_container(cfg[group], resolve=True)
        options.pop("_target_")
        module, _, name = str(target).rpartition(".")
        try:
            build = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            continue  # call_target refuses it by name
        hints = _option_types(build)
        problems += [f"{group}.{key}={value!r} is not {_type_name(hints[key])}" for key, value in options.items()
                     if key in hints and not _fits(value, hints[key])]
        validate = getattr(importlib.import_module(module), "validate_options", None)
        if validate is not None and not problems:
            try:
                validate(options)
            except SpecpipeError as err:
                problems.append(str(err).rstrip("."))
    if not problems:  # a controller is cheap to build and checks its own ranges (band's low <= high, ...)
        from specpipe.build import call_target

        try:
            call_target(cfg.controller, "controller", None)
        except SpecpipeError as err:
            problems.append(str(err).rstrip("."))
    if problems:
        return Check("options", "refuse", "; ".join(problems), "give each option a value of its type (see conf/)")
    return Check("options", "ok", "component options have the types their components declare")


def _option_types(build) -> dict:
    """Parameter name -> annotation of a build function, and of the class it returns where it
    passes `**options` on."""
    hints = typing.get_type_hints(build)
    returned = hints.pop("return", None)
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(build).parameters.values()) and inspect.isclass(returned):
        hints = {**typing.get_type_hints(returned.__init__), **hints}
    return hints


def _fits(value, hint) -> bool:
    if hint is typing.Any or hint is inspect.Parameter.empty:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    if origin is type(None):
        return value is None
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin) if isinstance(origin, type) else True


def _type_name(hint) -> str:
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
             list: "a list", type(None): "null"}
    return " or ".join(names.get(typing.get_origin(a) or a, str(a)) for a in arms)


def same_tokenizer_problems(target_tok, draft_tok) -> list[str]:
    """How two tokenizers differ ([]: the same ids mean the same text)."""
    problems = []
    if len(target_tok) != len(draft_tok):
        problems.append(f"vocabulary sizes differ ({len(target_tok)} vs {len(draft_tok)})")
    elif target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append("the same ids map to different token strings")
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        problems.append(f"EOS ids differ ({target_tok.eos_token_id} vs {draft_tok.eos_token_id})")
    return problems


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft model must tokenize exactly like the target: same vocabulary, same specials."""
    problems = same_tokenizer_problems(target_tok, draft_tok)
    if problems:
        raise SpecpipeError(
            f"The draft model '{draft_name}' does not share the target '{target_name}''s tokenizer: "
            f"{'; '.join(problems)}. Its token ids would mean different text to the target. Pick a "
            "draft from the target's family (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b), or "
            "a proposer that needs no second model: proposer=twin."
        )


def run_checks(cfg: DictConfig, target_tokenizer_loader, draft_tokenizer_loader,
               target_config_loader=lambda: None, draft_config_loader=lambda: None) -> list[Check]:
    settings = check_settings(cfg)  # first: the options check builds the controller, sized by these
    options = check_options(cfg) if settings.status != "refuse" else Check("options", "n/a", "not checked: fix the settings first")
    if "refuse" in (settings.status, options.status):  # later checks read these values
        return [settings, options]
    target_config = target_config_loader()
    tokenizer = check_tokenizer(cfg, target_tokenizer_loader, draft_tokenizer_loader)
    return [
        settings,
        options,
        check_proposer(cfg),
        check_early_exit(cfg, target_config),
        check_lora(cfg),
        *check_precision(cfg),
        check_sampling(cfg),
        tokenizer,
        check_heads(cfg, lambda: target_config),
        *check_engine(cfg, target_config),
        check_memory(cfg, target_config, draft_config_loader),
        check_batch(cfg, target_config, draft_config_loader, tokenizer.translated),
        check_early_stop(cfg),
    ]


def refuse_if_any(checks: list[Check]) -> None:
    for check in checks:
        if check.status == "refuse":
            fix = f" Fix: {check.fix}." if check.fix else ""
            raise SpecpipeError(f"{check.name}: {check.why.rstrip('.')}.{fix}")
