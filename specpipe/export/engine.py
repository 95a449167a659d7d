"""`EngineExport`: what an exporter hands back (settings, the command, what was lost), and the
helpers the proposers' mappings share (models as engines load them, SGLang's chain flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specpipe.models import zoo


@dataclass
class EngineExport:
    engine: str  # vllm | sglang
    version: str  # the engine version whose keys the settings follow
    settings: dict  # vLLM: the speculative_config; SGLang: flag -> value
    command: str  # the serve command, ready to paste
    warnings: list[str] = field(default_factory=list)


def sglang_chain(gamma: int) -> dict:
    """SGLang's flags for a chain of γ draft tokens: top-k 1, and the verified token counts as one
    of the draft tokens (as SGLang forces for top-k 1)."""
    return {"--speculative-num-steps": gamma, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": gamma + 1}


def engine_model(name: str) -> str:
    """A zoo name as its hub id; a local path made absolute; a hub id as is."""
    if name in zoo.ZOO:
        return zoo.ZOO[name].hub_id
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name
