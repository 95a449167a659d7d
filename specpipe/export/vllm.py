"""vLLM: the `speculative_config` JSON and the `vllm serve` command.

Keys and methods follow vLLM v0.34.0 by default, and v0.33.0 for users who pin it
(`engine_version=0.33.0`): `vllm/config/speculative.py` of each released wheel
(`SpeculativeConfig`, a pydantic dataclass that refuses unknown keys). The method is always
explicit. Each proposer maps itself (its module's DECLARATION.export["vllm"]), asking the plan
for the keys the version has (`plan.keys`) rather than comparing version strings; this module
pins the keys, adds what is common to every method (the batch schedule, as
`num_speculative_tokens_per_batch_size`) and refuses a key the version does not have.

0.34.0 removed the V1 model runner, and with it drafts with another tokenizer
(`use_heterogeneous_vocab`), `disable_padded_drafter_batch` and `custom_class`; suffix decoding
runs natively on the GPU with a cross-request corpus (`suffix_decoding_corpus_tokens`), and
every method honours the batch-size schedule.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from specpipe import jsonsafe
from specpipe.declaration import EngineExport
from specpipe.errors import SpecpipeError
from specpipe.export.plan import ExportPlan


@dataclass(frozen=True)
class Version:
    """What one vLLM release accepts in its speculative_config."""

    keys: tuple[str, ...]  # the user-settable SpeculativeConfig fields, in declaration order
    methods: tuple[str, ...]  # SpeculativeMethod (model-specific *_mtp names are all rewritten to mtp)
    scheduled: tuple[str, ...] | None  # methods that honour the batch-size schedule (None: every method)


VERSIONS = {
    "0.34.0": Version(
        keys=("enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
              "draft_decode_context_parallel_size", "quantization", "moe_backend", "attention_backend",
              "kv_cache_dtype", "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
              "disable_eagle_block_drop", "disable_lookahead_block_hashes", "draft_lm_head_quantization",
              "use_local_argmax_reduction", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
              "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
              "suffix_decoding_max_cached_requests", "suffix_decoding_corpus_tokens",
              "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_load_config",
              "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
              "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc",
              "speculator_options", "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"),
        methods=("ngram", "draft_model", "suffix", "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash",
                 "ngram_gpu", "dspark"),
        scheduled=None),  # one model runner (V2) for every method
    "0.33.0": Version(
        keys=("enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
              "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len", "revision",
              "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
              "disable_eagle_block_drop", "disable_lookahead_block_hashes", "draft_lm_head_quantization",
              "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min",
              "parallel_drafting", "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
              "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
              "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
              "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
              "draft_sample_method", "dspark_draft_topk", "xpress_topc", "fly_window_size",
              "fly_entropy_threshold", "fly_entropy_top_k"),
        methods=("ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states", "mtp",
                 "dflash", "ngram_gpu", "dspark"),
        # suffix runs on the V1 model runner only, which has no γ per batch size
        scheduled=("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")),
}
VERSION = "0.34.0"  # what `specpipe export vllm` writes unless told engine_version=
KEYS, METHODS = VERSIONS[VERSION].keys, VERSIONS[VERSION].methods


def pinned(version: str | None) -> str:
    """The version to write for (the default when None); another is a user error naming the key."""
    version = version or VERSION
    if version not in VERSIONS:
        raise SpecpipeError(f"engine_version={version}: specpipe writes vLLM {' or '.join(VERSIONS)} settings "
                            f"(default {VERSION}). Pass one of those, or none.")
    return version


def export(plan: ExportPlan, version: str | None = None) -> EngineExport:
    version = pinned(version)
    pin = VERSIONS[version]
    config, warnings = plan.settings_for("vllm", version, pin.methods, pin.keys)
    warnings += plan.verifier_settings("vllm", version, config)
    if config:
        warnings += _schedule(plan, config, version) + _verified_on_v1(config, version)
    unknown = set(config or {}) - set(pin.keys)
    if unknown or (config and config["method"] not in pin.methods):
        raise SpecpipeError(f"internal: the vLLM {version} export produced keys it does not have: {sorted(unknown)}")
    command = f"vllm serve {shlex.quote(plan.target)}"
    if config:
        command += f" --speculative-config {shlex.quote(jsonsafe.dumps(config))}"
    return EngineExport("vllm", version, config or {}, command, warnings)


def _verified_on_v1(config: dict, version: str) -> list[str]:
    """Block verification is in the V2 model runner's rejection sampler only: a method that runs on
    the V1 runner (suffix in 0.33.0) verifies token by token, so the key is dropped and said so."""
    scheduled = VERSIONS[version].scheduled  # the methods on the V2 runner (None: every method)
    if config.get("rejection_sample_method") != "block" or scheduled is None or config["method"] in scheduled:
        return []
    del config["rejection_sample_method"]
    return [f"verifier=block: vLLM {version} runs method {config['method']} on its V1 model runner, whose rejection "
            f"sampler has no block verification: it verifies token by token there (lossless, fewer tokens kept a "
            f"step; vLLM {VERSION} runs every method on V2, with block verification)."]


def _schedule(plan: ExportPlan, config: dict, version: str) -> list[str]:
    """batch_schedule {size: γ} (γ from that size up) as vLLM's inclusive ranges [start, end, γ]:
    the first from batch size 1 (the exported γ below the schedule's first size), the last range's
    γ carried to every larger batch, γ = 0 switching speculation off."""
    if not plan.batch_schedule:
        return []
    scheduled = VERSIONS[version].scheduled
    if scheduled is not None and config["method"] not in scheduled:
        return [f"batch_schedule {plan.batch_schedule}: vLLM {version} runs method {config['method']} on its V1 model "
                "runner, which has no γ per batch size: every batch size drafts "
                f"γ={plan.gamma} (num_speculative_tokens_per_batch_size is not written; vLLM {VERSION} has it)."]
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
