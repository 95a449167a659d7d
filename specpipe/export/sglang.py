"""SGLang: the `--speculative-*` flags of `python -m sglang.launch_server`.

Flags and algorithms follow SGLang v0.5.23 (`sglang/srt/arg_groups/fields/spec.py` of the
0.5.23 wheel, the `Spec` namespace its argument parser is built from). Each proposer maps itself
(its module's DECLARATION.export["sglang"]); this module pins the flags and refuses one the
version lacks. A chain of γ draft tokens is `chain(γ)`: `--speculative-num-steps γ
--speculative-eagle-topk 1 --speculative-num-draft-tokens γ+1` (the verified token counts as
one, as SGLang forces for top-k 1).
"""

from __future__ import annotations

import shlex

from specpipe.declaration import EngineExport
from specpipe.errors import SpecpipeError
from specpipe.export.plan import ExportPlan

VERSION = "0.5.23"
VERSIONS = (VERSION,)  # the versions specpipe writes for
FLAGS = ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
         "--speculative-draft-model-revision", "--speculative-draft-load-format", "--speculative-num-steps",
         "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-dflash-block-size",
         "--speculative-domino-candidate-pool-size", "--speculative-dspark-block-size",
         "--speculative-dspark-sps-table-path", "--speculative-dspark-confidence-sts-path",
         "--speculative-dspark-align-verify-tokens-to-graph-tier", "--speculative-accept-threshold-single",
         "--speculative-accept-threshold-acc", "--speculative-use-rejection-sampling",
         "--speculative-use-block-verification", "--speculative-token-map", "--speculative-attention-mode",
         "--speculative-draft-attention-backend", "--speculative-dsa-topk-backend",
         "--speculative-draft-kv-cache-dtype", "--speculative-draft-window-size", "--speculative-draft-sink-size",
         "--speculative-moe-runner-backend", "--speculative-moe-a2a-backend",
         "--speculative-enable-w4a4-mxfp4-megamoe", "--speculative-draft-model-quantization",
         "--speculative-adaptive", "--speculative-adaptive-config", "--speculative-ngram-min-bfs-breadth",
         "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-match-type", "--speculative-ngram-max-trie-depth",
         "--speculative-ngram-capacity", "--speculative-ngram-external-corpus-path",
         "--speculative-ngram-external-sam-budget", "--speculative-ngram-external-corpus-max-tokens")
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")


def pinned(version: str | None) -> str:
    """SGLang has one pinned version; another is a user error naming the key."""
    if version not in (None, VERSION):
        raise SpecpipeError(f"engine_version={version}: specpipe writes SGLang {VERSION} flags only. Pass "
                            f"engine_version={VERSION}, or none.")
    return VERSION


def export(plan: ExportPlan, version: str | None = None) -> EngineExport:
    pinned(version)
    flags, warnings = plan.settings_for("sglang", VERSION, ALGORITHMS, FLAGS)
    warnings += plan.verifier_settings("sglang", VERSION, flags)
    flags = flags or {}
    if plan.batch_schedule and flags:
        warnings.append(f"batch_schedule {plan.batch_schedule}: SGLang {VERSION} has no γ per batch size and no "
                        "switch-off by batch size; it drafts the exported γ at every load.")
    unknown = set(flags) - set(FLAGS)
    if unknown or (flags and flags["--speculative-algorithm"] not in ALGORITHMS):
        raise SpecpipeError(f"internal: the SGLang {VERSION} export produced flags it does not have: {sorted(unknown)}")
    command = " ".join(["python -m sglang.launch_server --model-path", shlex.quote(plan.target),
                        *(_argument(flag, value) for flag, value in flags.items())])
    return EngineExport("sglang", VERSION, flags, command, warnings)


def _argument(flag: str, value) -> str:
    """A flag and its value on the command line; a switch (True: argparse's store_true) alone."""
    return flag if value is True else f"{flag} {shlex.quote(str(value))}"
