"""Structured configs: the schema Hydra checks every override against.

Component groups (`model`, `proposer`, `verifier`, `controller`) are YAML files under conf/;
each component file names a `_target_` build function under `specpipe.` and its plain keyword
arguments. Top-level keys are typed here, so `gamma=abc` or a misspelt key is an error before
anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class GenerateConfig:
    model: Any = MISSING  # conf/model/: name (zoo name, .gguf, directory, hub id), quantize, chat
    proposer: Any = MISSING  # conf/proposer/
    verifier: Any = MISSING  # conf/verifier/
    controller: Any = MISSING  # conf/controller/
    prompt: str = "Write a Python function that checks whether a string is a palindrome."
    gamma: int = 4  # draft tokens per step (the fixed controller's γ; adaptive ones start here)
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    baseline: bool = True  # also run the plain target on the same prompt and measure the speedup
    output: str = "rich"  # rich | json | text


def register() -> None:
    ConfigStore.instance().store(name="generate_schema", node=GenerateConfig)


def conf_dir() -> Path:
    """conf/ of a source checkout, or the copy installed inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "generate.yaml").exists():
            return candidate
    raise FileNotFoundError("specpipe's conf/ directory is missing from this installation")
