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
from omegaconf import MISSING, DictConfig, open_dict

from specpipe.errors import SpecpipeError


@dataclass
class GenerateConfig:
    model: Any = MISSING  # conf/model/: name (zoo name, .gguf, directory, hub id), quantize, chat
    proposer: Any = MISSING  # conf/proposer/
    verifier: Any = MISSING  # conf/verifier/
    controller: Any = MISSING  # conf/controller/
    prompt: str = "Write a Python function that checks whether a string is a palindrome."
    gamma: int = 4  # draft tokens per step (the fixed controller's γ; adaptive ones start here)
    gamma_min: int = 1  # bounds every controller respects (the cost controller may go to 0)
    gamma_max: int = 8
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


def compose(overrides: list[str] = (), command: str = "generate") -> DictConfig:
    """The composed, resolved config of `command` (what the CLI runs); a bad override is a
    SpecpipeError. Library use: `Pipeline.from_config(compose(["proposer=draft", "gamma=3"]))`."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register()
    overrides = rewrite_model_overrides(list(overrides), conf_dir())
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir()), job_name="specpipe"):
            cfg = hydra_compose(config_name=command, overrides=list(overrides))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        detail = _condense(str(err))
        if err.__cause__ is not None:  # e.g. "Key 'quantize' is not in struct"
            detail += " (" + str(err.__cause__).splitlines()[0] + " for this choice.)"
        raise SpecpipeError(
            f"The settings `{' '.join(overrides)}` are not valid: {detail} Settings are key=value "
            f"pairs from conf/{command}.yaml; components are chosen by name (proposer=draft, "
            "verifier=rejection, ...) from the folders of conf/."
        ) from None
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def _condense(message: str) -> str:
    """Hydra's multi-line message as one sentence, without its search-path dump and `+key` hint."""
    message = message.split("Config search path")[0]
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and not line.startswith("To append"))


def rewrite_model_overrides(overrides: list[str], conf) -> list[str]:
    """`model=PATH_OR_HUB_ID` (not a file of conf/model/) -> `model=custom model.name=...`."""
    known = {p.stem for p in (conf / "model").glob("*.yaml")}
    out = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if key == "model" and eq and value not in known and "," not in value:
            escaped = value.replace("\\", "\\\\").replace("'", "\\'")
            out += ["model=custom", f"model.name='{escaped}'"]
        else:
            out.append(arg)
    return out
