"""SGLang: the `--speculative-*` flags of `python -m sglang.launch_server`.

Flags and algorithms follow SGLang v0.5.6 (`python/sglang/srt/server_args.py` at commit
7ae368efde14, the 0.5.6 version bump). Each proposer maps itself (its module's
DECLARATION.export["sglang"]); this module pins the flags and refuses one the version lacks.
A chain of γ draft tokens is `chain(γ)`: `--speculative-num-steps γ --speculative-eagle-topk 1
--speculative-num-draft-tokens γ+1` (the verified token counts as one, as SGLang forces for top-k 1).
"""

from __future__ import annotations

import shlex

from specpipe.errors import SpecpipeError
from specpipe.export.engine import EngineExport
from specpipe.export.plan import ExportPlan

VERSION = "0.5.6"
FLAGS = ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
         "--speculative-draft-model-revision", "--speculative-draft-load-format", "--speculative-num-steps",
         "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-accept-threshold-single",
         "--speculative-accept-threshold-acc", "--speculative-token-map", "--speculative-attention-mode",
         "--speculative-moe-runner-backend", "--speculative-ngram-min-match-window-size",
         "--speculative-ngram-max-match-window-size", "--speculative-ngram-min-bfs-breadth",
         "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-match-type",
         "--speculative-ngram-branch-length", "--speculative-ngram-capacity")
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


def export(plan: ExportPlan) -> EngineExport:
    if plan.batch_schedule and plan.proposer.name != "none":
        plan.warnings.append(f"batch_schedule {plan.batch_schedule}: SGLang {VERSION} has no γ per batch size and no "
                             "switch-off by batch size; it drafts the exported γ at every load.")
    flags = plan.settings_for("sglang", VERSION) or {}
    unknown = set(flags) - set(FLAGS)
    if unknown or (flags and flags["--speculative-algorithm"] not in ALGORITHMS):
        raise SpecpipeError(f"internal: the SGLang {VERSION} export produced flags it does not have: {sorted(unknown)}")
    command = " ".join(["python -m sglang.launch_server --model-path", shlex.quote(plan.target),
                        *(f"{flag} {shlex.quote(str(value))}" for flag, value in flags.items())])
    return EngineExport("sglang", VERSION, flags, command, list(plan.warnings))


def chain(gamma: int) -> dict:
    return {"--speculative-num-steps": gamma, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": gamma + 1}
