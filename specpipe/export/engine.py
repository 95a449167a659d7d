"""`EngineExport`: what an exporter hands back (settings, the command, what was lost)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineExport:
    engine: str  # vllm | sglang
    version: str  # the engine version whose keys the settings follow
    settings: dict  # vLLM: the speculative_config; SGLang: flag -> value
    command: str  # the serve command, ready to paste
    warnings: list[str] = field(default_factory=list)
