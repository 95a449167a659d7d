"""vLLM: the `speculative_config` JSON and the `vllm serve` command.

Keys and methods follow vLLM v0.11.0 (`vllm/config/speculative.py` at commit b8b302cde434,
the v0.11.0 tag). The method is always explicit. v0.11.0 lists `draft_model` but refuses it
at start-up (draft-model decoding reached vLLM's main branch in January 2026), so a draft or
twin export says so; ngram runs there as is.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from specpipe import jsonsafe
from specpipe.errors import SpecpipeError
from specpipe.export.engine import EngineExport
from specpipe.export.plan import ExportPlan

VERSION = "0.11.0"
# the user-settable SpeculativeConfig fields of v0.11.0
KEYS = ("enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
        "disable_logprobs", "quantization", "max_model_len", "revision", "code_revision",
        "disable_by_batch_size", "disable_padded_drafter_batch", "prompt_lookup_max", "prompt_lookup_min",
        "speculative_token_tree")
METHODS = ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp", "ernie_mtp",
           "qwen3_next_mtp", "mimo_mtp", "longcat_flash_mtp", "mtp")
DRAFT_MODEL_NOTE = (f"vLLM {VERSION} lists method draft_model but refuses it at start-up (NotImplementedError); "
                    "draft-model speculative decoding reached vLLM's main branch in January 2026: serve with a "
                    "release that includes it.")


def export(plan: ExportPlan, medusa_dir: Path = Path("medusa-vllm")) -> EngineExport:
    """medusa_dir: where the command writes the heads with the target's LM head (vLLM loads it
    from there)."""
    warnings = list(plan.warnings)
    config = _config(plan, warnings, medusa_dir)
    if config:
        _schedule(plan, config, warnings)
    unknown = set(config or {}) - set(KEYS)
    if unknown or (config and config["method"] not in METHODS):
        raise SpecpipeError(f"internal: the vLLM {VERSION} export produced keys it does not have: {sorted(unknown)}")
    command = f"vllm serve {shlex.quote(plan.target)}"
    if config:
        command += f" --speculative-config {shlex.quote(jsonsafe.dumps(config))}"
    return EngineExport("vllm", VERSION, config or {}, command, warnings)


def _config(plan: ExportPlan, warnings: list[str], medusa_dir: Path) -> dict | None:
    if plan.proposer == "none":
        warnings.append("proposer=none: nothing to speculate with; the command serves the plain target.")
        return None
    if plan.proposer == "ngram":
        return {"method": "ngram", "num_speculative_tokens": plan.gamma,
                "prompt_lookup_min": plan.ngram_min, "prompt_lookup_max": plan.ngram_max}
    if plan.proposer == "draft":
        warnings.append(DRAFT_MODEL_NOTE)
        return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma}
    if plan.proposer == "twin":
        warnings += [DRAFT_MODEL_NOTE, "twin: vLLM has no int8 copy of the target as a draft; exported as the "
                     "target drafting for itself with fp8 weights (quantization=fp8, the nearest GPU setting)."]
        return {"method": "draft_model", "model": plan.draft, "num_speculative_tokens": plan.gamma,
                "quantization": "fp8"}
    if plan.proposer == "medusa":
        return _medusa(plan, warnings, medusa_dir)
    if plan.proposer == "eagle":
        return _eagle(plan, warnings)
    raise SpecpipeError(f"proposer={plan.proposer} has no vLLM export yet. Exportable: ngram, draft, twin, medusa, "
                        "eagle.")


def _schedule(plan: ExportPlan, config: dict, warnings: list[str]) -> None:
    """batch_schedule: vLLM drafts one γ at every batch size, but switches speculation off for
    new requests once more than `disable_by_batch_size` are enqueued: the schedule's first γ = 0."""
    if not plan.batch_schedule:
        return
    if plan.off_from is not None:
        config["disable_by_batch_size"] = max(plan.off_from - 1, 1)
    varied = {size: gamma for size, gamma in plan.batch_schedule.items() if gamma not in (0, plan.gamma)}
    if varied:
        warnings.append(f"batch_schedule {plan.batch_schedule}: vLLM {VERSION} has one num_speculative_tokens for "
                        f"every batch size (γ={plan.gamma} exported); the γ of batch sizes {sorted(varied)} is lost"
                        + (", its switch-off kept as disable_by_batch_size" if plan.off_from else "") + ".")


def _medusa(plan: ExportPlan, warnings: list[str], medusa_dir: Path) -> dict:
    """vLLM builds as many heads as num_speculative_tokens and loads the shared LM head from
    the heads' own checkpoint: the export writes a copy of the heads with the target's LM head."""
    from specpipe.heads.io import read_config

    heads = read_config(plan.heads, "medusa")
    if plan.tree:
        warnings.append(f"proposer.tree: vLLM {VERSION}'s Medusa proposer drafts a chain (each head's top token); "
                        "the candidate tree is lost.")
    return {"method": "medusa", "model": str(medusa_dir.resolve()), "num_speculative_tokens": heads["num_heads"]}


def _eagle(plan: ExportPlan, warnings: list[str]) -> dict:
    """The heads folder is already vLLM's EAGLE layout; vLLM shares the target's embeddings and
    LM head with it, as specpipe does."""
    from specpipe.heads.io import read_config

    read_config(plan.heads, "eagle")  # a clear error now, not at vLLM's start-up
    if plan.tree:
        warnings.append(f"proposer.tree: vLLM {VERSION} drafts EAGLE as a chain (its speculative_token_tree is a "
                        f"static tree); EAGLE-2's dynamic tree is exported as a chain of γ={plan.gamma}.")
    return {"method": "eagle", "model": plan.heads, "num_speculative_tokens": plan.gamma}
