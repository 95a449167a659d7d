"""vLLM: the `speculative_config` JSON and the `vllm serve` command.

Keys and methods follow vLLM v0.11.0 (`vllm/config/speculative.py` at commit b8b302cde434,
the v0.11.0 tag). The method is always explicit. Each proposer maps itself (its module's
DECLARATION.export["vllm"]); this module pins the engine's keys, adds what is common to every
method (the batch schedule) and refuses a key the pinned version does not have.
"""

from __future__ import annotations

import shlex

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


def export(plan: ExportPlan) -> EngineExport:
    config = plan.settings_for("vllm", VERSION)
    if config:
        _schedule(plan, config)
    unknown = set(config or {}) - set(KEYS)
    if unknown or (config and config["method"] not in METHODS):
        raise SpecpipeError(f"internal: the vLLM {VERSION} export produced keys it does not have: {sorted(unknown)}")
    command = f"vllm serve {shlex.quote(plan.target)}"
    if config:
        command += f" --speculative-config {shlex.quote(jsonsafe.dumps(config))}"
    return EngineExport("vllm", VERSION, config or {}, command, list(plan.warnings))


def _schedule(plan: ExportPlan, config: dict) -> None:
    """batch_schedule: vLLM drafts one γ at every batch size, but switches speculation off for
    new requests once more than `disable_by_batch_size` are enqueued: the schedule's first γ = 0."""
    if not plan.batch_schedule:
        return
    if plan.off_from is not None:
        config["disable_by_batch_size"] = max(plan.off_from - 1, 1)
    varied = {size: gamma for size, gamma in plan.batch_schedule.items() if gamma not in (0, plan.gamma)}
    if varied:
        plan.warnings.append(f"batch_schedule {plan.batch_schedule}: vLLM {VERSION} has one num_speculative_tokens "
                             f"for every batch size (γ={plan.gamma} exported); the γ of batch sizes {sorted(varied)} "
                             "is lost" + (", its switch-off kept as disable_by_batch_size" if plan.off_from else "") + ".")
