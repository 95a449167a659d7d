"""The transformers floor in pyproject.toml is the oldest release the code runs on.

engine=hf passes its DynamicCache as `cache=`, a name transformers' model forwards take from 5.24
on; an older release swallows the unknown keyword, keeps no cache and decodes every step with no
context, silently wrong. These tests fail at once, and say why, on such a release.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from packaging.version import Version
import transformers
from transformers import LlamaForCausalLM

from conftest import PROMPT, tiny_model, feed
from specpipe.engine.hf import HFRunner

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def floor() -> Version:
    match = re.search(r'"transformers>=([0-9][0-9.]*)"', PYPROJECT.read_text())
    assert match, "pyproject.toml names no transformers>= floor"
    return Version(match.group(1))


def test_installed_transformers_meets_the_floor():
    assert Version(transformers.__version__) >= floor(), (transformers.__version__, floor())


def test_model_forward_takes_the_cache_keyword():
    assert "cache" in inspect.signature(LlamaForCausalLM.forward).parameters, (
        f"transformers {transformers.__version__} takes no `cache=`: engine=hf needs >= {floor()}")


def test_hf_runner_cache_fills_and_crops():
    runner = HFRunner(tiny_model(0))
    feed(runner, PROMPT)
    assert runner.length == len(PROMPT), f"no cache kept on transformers {transformers.__version__}"
    runner.crop(0, 3)
    assert runner.length == 3
