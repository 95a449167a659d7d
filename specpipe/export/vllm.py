"""vLLM: the `speculative_config` JSON and the `vllm serve` command.

Keys and methods follow vLLM v0.33.0 (`vllm/config/speculative.py` of the v0.33.0 wheel:
`SpeculativeConfig`, a pydantic dataclass that refuses unknown keys). The method is always
explicit. Each proposer maps itself (its module's DECLARATION.export["vllm"]); this module pins
the engine's keys, adds what is common to every method (the batch schedule, as
`num_speculative_tokens_per_batch_size`) and refuses a key the pinned version does not have.
"""

from __future__ import annotations

import shlex

from specpipe import jsonsafe
from specpipe.errors import SpecpipeError
from specpipe.export.engine import EngineExport
from specpipe.export.plan import ExportPlan

VERSION = "0.33.0"
# the user-settable SpeculativeConfig fields of v0.33.0, in declaration order
KEYS = ("enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
        "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len", "revision",
        "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch", "disable_eagle_block_drop",
        "disable_lookahead_block_hashes", "draft_lm_head_quantization", "use_local_argmax_reduction",
        "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
        "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
        "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
        "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc",
        "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
METHODS = ("ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states", "mtp",
           "dflash", "ngram_gpu", "dspark")  # and model-specific *_mtp names, all rewritten to mtp
# methods whose γ per batch size the V1 model runner honours (suffix runs on V1 only and drops it)
SCHEDULED = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")


def export(plan: ExportPlan) -> EngineExport:
    config, warnings = plan.settings_for("vllm", VERSION, METHODS)
    if config:
        warnings += _schedule(plan, config)
    unknown = set(config or {}) - set(KEYS)
    if unknown or (config and config["method"] not in METHODS):
        raise SpecpipeError(f"internal: the vLLM {VERSION} export produced keys it does not have: {sorted(unknown)}")
    command = f"vllm serve {shlex.quote(plan.target)}"
    if config:
        command += f" --speculative-config {shlex.quote(jsonsafe.dumps(config))}"
    return EngineExport("vllm", VERSION, config or {}, command, warnings)


def _schedule(plan: ExportPlan, config: dict) -> list[str]:
    """batch_schedule {size: γ} (γ from that size up) as vLLM's inclusive ranges [start, end, γ]:
    the first from batch size 1 (the exported γ below the schedule's first size), the last range's
    γ carried to every larger batch, γ = 0 switching speculation off."""
    if not plan.batch_schedule:
        return []
    if config["method"] not in SCHEDULED:
        return [f"batch_schedule {plan.batch_schedule}: vLLM {VERSION} runs method {config['method']} on its V1 model "
                "runner, which has no γ per batch size: every batch size drafts "
                f"γ={plan.gamma} (num_speculative_tokens_per_batch_size is not written)."]
    lost = []
    sizes = sorted(plan.batch_schedule)
    ranges = [[1, sizes[0] - 1, plan.gamma]] if sizes[0] > 1 else []
    ranges += [[size, (sizes[i + 1] - 1) if i + 1 < len(sizes) else size, min(plan.batch_schedule[size], plan.gamma)]
               for i, size in enumerate(sizes)]
    config["num_speculative_tokens_per_batch_size"] = ranges
    if any(gamma > plan.gamma for gamma in plan.batch_schedule.values()):
        lost.append(f"batch_schedule {plan.batch_schedule}: vLLM caps every batch size's γ at "
                    f"num_speculative_tokens={plan.gamma}.")
    return lost
