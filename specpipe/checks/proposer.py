"""Rules about the proposer and what it meets: what it declares (in words), the verifier's
sampling, trained heads against the target, a controller's early stop, and batching."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe.checks.identity import kind_of
from specpipe.checks.result import Check
from specpipe.components import call_target
from specpipe.declaration import batch_refusal
from specpipe.errors import SpecpipeError
from specpipe.settings import Settings
from specpipe.verifiers.greedy import temperature_refusal
from specpipe.verifiers.rejection import CHAINS_ONLY, tree_refusal


def check_proposer(s: Settings) -> Check:
    """What the proposer declares of itself, in words (the first row of `specpipe check`)."""
    d = s.declaration
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


def check_sampling(cfg: DictConfig, s: Settings) -> Check:
    """cfg: for the verifier it names."""
    name = kind_of(cfg.verifier)
    refusal = temperature_refusal(s.temperature) if name == "greedy" else None
    refusal = refusal or (tree_refusal(name) if s.tree_option else None)
    if refusal is not None:
        return Check.refused("sampling", refusal)
    if name == "typical":
        return Check("sampling", "warn", "verifier=typical is LOSSY: with temperature > 0 the output is not "
                     "distributed as the target's (at temperature 0 it keeps the target's argmax tokens)",
                     "use verifier=rejection for lossless sampling")
    if name == "greedy" and (s.top_k or s.top_p < 1.0):
        return Check("sampling", "warn", "top_k / top_p have no effect on greedy decoding")
    declaration = s.declaration
    notes = ""
    if s.temperature > 0 and not declaration.draft_probs:
        notes += f"; proposer={declaration.name} drafts without probabilities (one-hot: lossless, kept less often)"
    if name in CHAINS_ONLY and declaration.tree == "auto":
        notes += f"; proposer={declaration.name} drafts its best path (verifier={name} verifies chains)"
    return Check("sampling", "ok", f"verifier={name} honours temperature={s.temperature}, "
                 f"top_k={s.top_k}, top_p={s.top_p} identically on target and draft{notes}")


def check_heads(cfg: DictConfig, s: Settings) -> Check:
    """Heads trained for another hidden size, vocabulary or target are refused by name (cfg: for
    the proposer's options)."""
    kind, model = s.proposer, s.model
    if not s.declaration.heads:
        return Check("heads", "n/a", f"proposer={kind} uses no trained heads")
    from omegaconf import OmegaConf

    from specpipe.heads.integrity import heads_problem, shape_problem
    from specpipe.heads.io import damaged_heads, read_config

    if OmegaConf.is_missing(cfg.proposer, "heads"):
        return Check("heads", "refuse", f"proposer={kind} needs proposer.heads=DIR (trained heads)",
                     f"train some: specpipe train proposer={kind} model={model}; or use a recipe that "
                     f"ships them: recipe=recipes/smollm2-135m/{kind}.yaml")
    read = s.declaration.read_heads or (lambda folder: read_config(folder, kind))
    try:
        heads = read(cfg.proposer.heads)
    except SpecpipeError as err:
        return Check("heads", "refuse", str(err), f"train heads: specpipe train proposer={kind} model={model}")
    if damaged := heads_problem(cfg.proposer.heads):  # as a model's files are, before anything reads them
        return Check("heads", "refuse", damaged_heads(cfg.proposer.heads, damaged).rstrip("."),
                     f"restore the folder, or train heads: specpipe train proposer={kind} model={model}")
    target = s.target_config  # None: not fetched (export), only the trained-for name is compared
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
        return Check("heads", "refuse", f"the {kind} heads in {cfg.proposer.heads} do not fit {model}: "
                     + "; ".join(problems), f"train heads for this target: specpipe train proposer={kind} "
                     f"model={model}")
    if trained_for and trained_for != model:
        return Check("heads", "refuse", f"the {kind} heads in {cfg.proposer.heads} were trained on {trained_for}, "
                     f"not {model} (same shapes, other features: they would guess blindly)",
                     f"use heads trained on {model}, or model={trained_for}")
    return Check("heads", "ok", f"{kind} heads trained on {trained_for or 'an unnamed target'}, shapes match")


def check_early_stop(cfg: DictConfig, s: Settings) -> Check:
    """A controller that stops drafts early (controller=confidence) needs a proposer that asks it."""
    from specpipe.controllers.base import Controller

    controller = call_target(cfg.controller, "controller", None)
    if controller is None or type(controller).stop_below is Controller.stop_below:
        return Check("early stop", "n/a", f"controller={kind_of(cfg.controller)} does not stop drafts early")
    declaration = s.declaration
    if not declaration.early_stop:
        return Check("early stop", "warn", f"controller={kind_of(cfg.controller)} stops drafts when the drafter's "
                     f"confidence drops, but proposer={declaration.name} never asks it: every draft runs to γ and the "
                     "controller learns nothing", "use controller=fixed, heuristic, band or cost with this proposer")
    return Check("early stop", "ok", f"proposer={declaration.name} stops its drafts where "
                 f"controller={kind_of(cfg.controller)} says")


def check_batch(s: Settings, translated: bool = False) -> Check:
    """Whether this composition decodes several sequences in one forward, and its batch schedule:
    `declaration.batch_refusal`, the rule the decode loop applies, given the engines the settings
    resolved (hf has no batch rows; native and llama.cpp have)."""
    from specpipe.controllers.base import check_schedule

    try:
        schedule = check_schedule(s.batch_schedule)
    except SpecpipeError as err:
        return Check("batch", "refuse", str(err).rstrip("."), "fix batch_schedule=")
    kind, size = s.proposer, s.rows
    reason = batch_refusal(target_engine="hf" if s.engine == "hf" else None, translated=translated, draft_engine="hf" if s.draft.engine == "hf" else None)
    plan = f"; batch_schedule {schedule} (γ per batch size)" if schedule else ""
    if reason is not None:
        return Check("batch", "warn" if size > 1 else "ok", f"one sequence at a time: {reason}{plan}",
                     "use engine=native (auto) to batch" if size > 1 else "")
    return Check("batch", "ok", f"{kind} batches: {size} sequence(s) per forward, each with its own KV cache row "
                 f"and acceptance{plan}")

