"""results.json: one bench run, written atomically, read back with its schema checked.

    {"schema": "specpipe.bench/2", "created", "model", "strategy": {proposer, verifier,
     controller, gamma, lossless}, "config", "environment", "prompts": [per-prompt results],
     "summary": {category: figures, ..., "overall": figures}, "load": {...} (a request load only)}

Schema 2 added `load` (bench/load.py; its `prompts` list is empty); files of schema 1 still read.

A results.json exists only when its run finished: that is what lets an interrupted sweep resume.
Its `measured_with` (every setting but where it is written, and a digest of the prompts' text)
is what a rerun compares before it reuses it: other settings, and it measures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specpipe import jsonsafe
from specpipe.errors import SpecpipeError
from specpipe.outputs import atomic_write

SCHEMA = "specpipe.bench/2"
READABLE = ("specpipe.bench/1", SCHEMA)
RESULTS_FILE = "results.json"
REQUIRED = {"schema": str, "created": str, "model": str, "strategy": dict, "config": dict,
            "environment": dict, "prompts": list, "summary": dict}
NOT_MEASURED = ("out", "plot")  # where results go and whether they are drawn: never what they measure
SUMMARY_KEYS = ("prompts", "baseline_tokens_per_s", "tokens_per_s", "speedup", "acceptance_rate",
                "mean_accepted_length", "per_position_acceptance", "gamma", "time_per_token_ms",
                "exactness", "peers")


def environment() -> dict:
    """The machine and package versions a figure was measured with."""
    import torch

    versions = {"python": platform.python_version()}
    for package in ("specpipe", "torch", "transformers", "hydra-core"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"machine": platform.machine(), "processor": platform.processor() or None,
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "versions": versions}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_json(path: Path, payload: dict) -> Path:
    """Atomically (outputs.atomic_write): readers never see half a file. Strict JSON
    (jsonsafe): a figure that is not a finite number is written as null."""
    return atomic_write(path, lambda f: jsonsafe.dump(payload, f, indent=1))


def measured_with(cfg: DictConfig, prompts: list[dict]) -> dict:
    """What a result depends on: every setting except NOT_MEASURED (so a setting added later
    counts by default), and the text of the prompts it ran. JSON-shaped, as read back."""
    settings = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in NOT_MEASURED}
    text = json.dumps(prompts, sort_keys=True, ensure_ascii=False, default=str).encode()
    return json.loads(json.dumps({"settings": settings, "prompts": hashlib.sha256(text).hexdigest()[:16]}))


def earlier_results(path: Path, measured: dict) -> tuple[dict | None, list[str]]:
    """(the results at `path` if they were measured as `measured` says, else None; what differs,
    as "key: then → now"). A file older than `measured_with` is compared by its config."""
    if not Path(path).is_file():
        return None, []
    payload = read_results(path)  # a damaged file is an error, not a finished job
    then = payload.get("measured_with") or {
        "settings": {k: v for k, v in payload["config"].items() if k not in NOT_MEASURED}}
    changed = changes(then, measured)
    return (None if changed else payload), changed


def changes(then: dict, measured: dict) -> list[str]:
    """What differs between two `measured_with`, as "key: then → now" (the prompts' text last)."""
    if not isinstance(then, dict) or not isinstance(then.get("settings"), dict):
        return ["an unknown earlier run (no settings recorded)"]
    changed = _differences(dict(_flat(then["settings"])), dict(_flat(measured["settings"])))
    if not changed and then.get("prompts", measured["prompts"]) != measured["prompts"]:
        changed.append(f"the text of prompts={measured['settings'].get('prompts')} (edited since)")
    return changed


def _flat(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _differences(then: dict, now: dict) -> list[str]:
    unset = "(unset)"
    return [f"{key}: {then.get(key, unset)} → {now.get(key, unset)}" for key in sorted(then.keys() | now.keys())
            if then.get(key, unset) != now.get(key, unset)]


def validate(payload: dict, where: str = "results") -> dict:
    """The payload, if it follows the schema; a SpecpipeError naming the first problem if not."""
    if not isinstance(payload, dict) or payload.get("schema") not in READABLE:
        raise SpecpipeError(f"{where} is not a specpipe bench result (schema {' or '.join(READABLE)}).")
    if "load" in payload and not isinstance(payload["load"], dict):
        raise SpecpipeError(f"{where}: `load` is not a dict.")
    for key, kind in REQUIRED.items():
        if not isinstance(payload.get(key), kind):
            raise SpecpipeError(f"{where}: `{key}` is missing or not a {kind.__name__}.")
    if "overall" not in payload["summary"]:
        raise SpecpipeError(f"{where}: the summary has no `overall` entry.")
    for category, figures in payload["summary"].items():
        missing = [k for k in SUMMARY_KEYS if k not in figures]
        if missing:
            raise SpecpipeError(f"{where}: summary[{category}] lacks {missing}.")
    return payload


def read_results(path: Path) -> dict:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecpipeError(f"{path} cannot be read as JSON ({err}).") from None
    return validate(payload, str(path))
