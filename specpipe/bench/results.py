"""results.json: one bench run, written atomically, read back with its schema checked.

    {"schema": "specpipe.bench/2", "created", "model", "strategy": {proposer, verifier,
     controller, gamma, lossless}, "config", "environment", "prompts": [per-prompt results],
     "summary": {category: figures, ..., "overall": figures}, "load": {...} (a request load only)}

Schema 2 added `load` (bench/load.py; its `prompts` list is empty); files of schema 1 still read.

A results.json exists only when its run finished: that is what lets an interrupted sweep resume.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from importlib import metadata
from pathlib import Path

from specpipe.errors import SpecpipeError

SCHEMA = "specpipe.bench/2"
READABLE = ("specpipe.bench/1", SCHEMA)
RESULTS_FILE = "results.json"
REQUIRED = {"schema": str, "created": str, "model": str, "strategy": dict, "config": dict,
            "environment": dict, "prompts": list, "summary": dict}
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
    """A temporary file in the same folder, renamed into place: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".specpipe-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are meant to be read
    os.replace(tmp, path)
    return path


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
