"""SGLang: the `--speculative-*` flags of `python -m sglang.launch_server`.

Flags and algorithms follow SGLang v0.5.6 (`python/sglang/srt/server_args.py` at commit
7ae368efde14, the 0.5.6 version bump). A chain of γ draft tokens is `--speculative-num-steps γ
--speculative-eagle-topk 1 --speculative-num-draft-tokens γ+1` (the verified token counts as
one, as SGLang forces for top-k 1). Later SGLang versions renamed the n-gram flags.
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
    warnings = list(plan.warnings)
    if plan.batch_schedule and plan.proposer != "none":
        warnings.append(f"batch_schedule {plan.batch_schedule}: SGLang {VERSION} has no γ per batch size and no "
                        "switch-off by batch size; it drafts the exported γ at every load.")
    flags = _flags(plan, warnings)
    unknown = set(flags) - set(FLAGS)
    if unknown or (flags and flags["--speculative-algorithm"] not in ALGORITHMS):
        raise SpecpipeError(f"internal: the SGLang {VERSION} export produced flags it does not have: {sorted(unknown)}")
    command = " ".join(["python -m sglang.launch_server --model-path", shlex.quote(plan.target),
                        *(f"{flag} {shlex.quote(str(value))}" for flag, value in flags.items())])
    return EngineExport("sglang", VERSION, flags, command, warnings)


def _chain(gamma: int) -> dict:
    return {"--speculative-num-steps": gamma, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": gamma + 1}


def _flags(plan: ExportPlan, warnings: list[str]) -> dict:
    if plan.proposer == "none":
        warnings.append("proposer=none: nothing to speculate with; the command serves the plain target.")
        return {}
    if plan.proposer == "ngram":
        warnings.append(f"SGLang {VERSION} runs NGRAM on CUDA only.")
        return {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": plan.gamma + 1,
                "--speculative-ngram-min-match-window-size": plan.ngram_min,
                "--speculative-ngram-max-match-window-size": plan.ngram_max,
                "--speculative-ngram-min-bfs-breadth": 1, "--speculative-ngram-max-bfs-breadth": 1}
    if plan.proposer == "draft":
        return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **_chain(plan.gamma)}
    if plan.proposer == "twin":
        warnings.append(f"twin: SGLang {VERSION} has no flag to quantize the draft, so the target drafts for itself "
                        "at full cost and this cannot pay; prefer a smaller draft model or ngram there.")
        return {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": plan.draft, **_chain(plan.gamma)}
    if plan.proposer == "medusa":
        warnings.append(f"SGLang {VERSION} has no Medusa (its algorithms: {', '.join(ALGORITHMS)}): the command "
                        "serves the plain target, and the heads' speedup is lost. vLLM serves Medusa heads.")
        return {}
    if plan.proposer == "eagle":
        return {"--speculative-algorithm": "EAGLE", "--speculative-draft-model-path": plan.heads, **_eagle_shape(plan)}
    raise SpecpipeError(f"proposer={plan.proposer} has no SGLang export yet. Exportable: ngram, draft, twin, medusa, "
                        "eagle.")


def _eagle_shape(plan: ExportPlan) -> dict:
    """SGLang's EAGLE drafts EAGLE-2's dynamic tree itself: depth γ, top-k per step, and the
    number of nodes kept (plus the verified token)."""
    if not plan.tree:
        return _chain(plan.gamma)
    return {"--speculative-num-steps": plan.gamma, "--speculative-eagle-topk": int(plan.tree["top_k"]),
            "--speculative-num-draft-tokens": int(plan.tree["nodes"]) + 1}
