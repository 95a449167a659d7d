"""vLLM's own `SpeculativeConfig`, from a released wheel, judging specpipe's exports.

The tests run offline, so they never download vLLM: they look for its wheel in the folder
named by `$SPECPIPE_VLLM_WHEELS` (filled with `pip download --no-deps vllm==0.34.0 -d DIR`, and
0.33.0 likewise) and skip without it. Never installed: the wheel's Python sources are unpacked
into a temporary folder and imported by a child process, one per version (two vLLM versions
cannot share one process), which validates every settings mapping it is given.

In the child, what vLLM's config package imports but never uses to validate a config (its
networking, serialisation and API types: zmq, aiohttp, cbor2, openai) is stubbed when it is not
installed, and a method that reads a draft checkpoint (draft_model, eagle, eagle3) skips loading
it: the draft-model setup is replaced by its checks that need no checkpoint, so the keys, their
types, the method name and the cross-field rules all still go through vLLM's own validators.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CHILD = r'''
import importlib.abc, importlib.machinery, importlib.util, json, sys
from unittest import mock

sys.path.insert(0, sys.argv[1])
STUBS = [name for name in ("zmq", "aiohttp", "cbor2", "openai_harmony", "openai")
         if importlib.util.find_spec(name) is None]


class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Stub())
from vllm.config.speculative import SpeculativeConfig

try:
    from vllm.v1.worker.gpu.spec_decode import speculator_config as specs
except ImportError:  # before the per-speculator configs: model methods are not judged
    specs = None
if specs is not None:
    def configure_without_checkpoint(cls, spec):
        spec.prompt_lookup_max = spec.prompt_lookup_min = 0
        if spec.num_speculative_tokens is None:
            raise ValueError("a speculative model was provided, but num_speculative_tokens was not")

    specs.DraftModelSpeculatorConfig.configure = classmethod(configure_without_checkpoint)
MODEL_FREE = ("ngram", "suffix", "ngram_gpu")
results = []
for settings in json.load(sys.stdin):
    if specs is None and settings.get("method") not in MODEL_FREE:
        results.append("skipped")
        continue
    try:
        config = SpeculativeConfig(**settings)
        assert config.method == settings["method"], (config.method, settings["method"])
        assert config.num_speculative_tokens == settings["num_speculative_tokens"]
        results.append(None)
    except ImportError as err:  # a method's optional package (0.33's suffix: arctic-inference)
        results.append(f"skipped: {err}")
    except Exception as err:  # what vLLM refuses, with its words
        results.append(f"{type(err).__name__}: {err}")
print(json.dumps(results))
'''


def wheel(version: str) -> Path | None:
    """The vllm wheel of `version` in $SPECPIPE_VLLM_WHEELS, if there is one."""
    folder = os.environ.get("SPECPIPE_VLLM_WHEELS")
    found = sorted(Path(folder).glob(f"vllm-{version}-*.whl")) if folder else []
    return found[0] if found else None


def unpack(whl: Path, into: Path) -> Path:
    """The wheel's Python sources (no compiled extensions: the config package needs none)."""
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(into, [name for name in zf.namelist() if name.startswith("vllm/") and name.endswith(".py")])
    return into


def validate(sources: Path, settings: list[dict]) -> list[str | None]:
    """For each mapping, None if vLLM's SpeculativeConfig accepts it, else its error ("skipped..."
    for a method this version cannot judge without a checkpoint or a package it needs)."""
    result = subprocess.run([sys.executable, "-c", CHILD, str(sources)], input=json.dumps(settings), text=True,
                            capture_output=True, timeout=600, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


FIELDS = r'''
import dataclasses, typing
from vllm.config import speculative


def values(kind):
    """The strings of a Literal, or of a Union of Literals (SpeculativeMethod's form)."""
    return [kind] if isinstance(kind, str) else [v for arg in typing.get_args(kind) for v in values(arg)]


print(json.dumps({"fields": [f.name for f in dataclasses.fields(speculative.SpeculativeConfig)],
                  "methods": values(getattr(speculative, "SpeculativeMethod", str))}))
'''


def speculative_config(sources: Path) -> dict[str, list[str]]:
    """SpeculativeConfig's field names and SpeculativeMethod's values, read from vLLM's own sources
    by a child process (the stubs of `CHILD`, then `FIELDS`)."""
    code = CHILD.split("MODEL_FREE = ")[0] + FIELDS
    result = subprocess.run([sys.executable, "-c", code, str(sources)], text=True, capture_output=True, timeout=600,
                            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
