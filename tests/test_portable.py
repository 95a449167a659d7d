"""Every shipped recipe and strategy checks and exports on a fresh machine: an empty model cache,
no package index, nothing downloaded (a zoo model is judged by its zoo entry: architecture, sizes,
tokenizer family)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specpipe import cli
from specpipe.models import zoo
from test_cli import specpipe

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*/*.yaml"))
STRATEGIES = sorted((REPO / "strategies").glob("*.yaml"))
TARGETS = ("smollm2-135m", "qwen2.5-coder-1.5b")  # a strategy names no target: each zoo target
OFFLINE = {"PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1"}  # no index, no hub: a download fails


def _forbidden(*args, **kwargs):
    raise AssertionError(f"a model was fetched: {args}")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty model cache, no index, and any fetch a failure (not a slow download)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECPIPE_CACHE", str(cache))
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(zoo, "fetch", _forbidden)
    monkeypatch.setattr(zoo, "pip_download", _forbidden)
    yield cache
    assert not list(cache.glob("models/*/*")), "something was written into the model cache"


def _cases() -> list:
    cases = [pytest.param([f"recipe={path}"], id=str(path.relative_to(REPO))) for path in RECIPES]
    cases += [pytest.param([f"strategy={path}", f"model={target}"], id=f"{path.relative_to(REPO)}-{target}")
              for path in STRATEGIES for target in TARGETS]
    return cases


@pytest.mark.parametrize("settings", _cases())
def test_check_and_both_exports_work_with_an_empty_cache(fresh, tmp_path, capsys, settings):
    assert cli.main(["check", *settings]) == 0, capsys.readouterr()
    assert "refuse" not in capsys.readouterr().out
    out = tmp_path / "spec.json"
    assert cli.main(["export", "vllm", *settings, f"out={out}"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr()
    assert printed.out.startswith("vllm serve ") and "exporting for vllm 0.34.0" in printed.err
    if "--speculative-config" in printed.out:
        assert json.loads(out.read_text())["method"]
    assert cli.main(["export", "sglang", *settings]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("python -m sglang.launch_server ")


def test_the_walk_covers_every_shipped_recipe_and_strategy():
    assert len(RECIPES) >= 6 and len(STRATEGIES) >= 6
    for path in RECIPES:
        assert yaml.safe_load(path.read_text())["target"] in zoo.ZOO  # judged by the zoo entry


@pytest.mark.parametrize("settings", [c.values[0] for c in _cases() if "smollm2" in c.id or "recipes/" in c.id])
def test_bench_prints_its_config_without_a_model(tmp_path, settings):
    """`bench --cfg job` composes the recipe (Hydra prints it) and loads nothing."""
    result = specpipe("bench", *settings, "--cfg", "job", env={"SPECPIPE_CACHE": str(tmp_path), **OFFLINE})
    assert result.returncode == 0, result.stderr
    assert "proposer:" in result.stdout and not list(tmp_path.glob("models/*/*"))


def test_the_zoo_config_is_what_the_checks_judge_an_unfetched_model_by(fresh):
    from specpipe.engine.native_model import config_unsupported_reason
    from specpipe.models.loader import zoo_config

    for name, entry in zoo.ZOO.items():
        config = zoo_config(name)
        assert config_unsupported_reason(config) is None, name  # every zoo model runs natively
        assert config.vocab_size == entry.vocab_size and config.architectures[0].lower().startswith(entry.architecture)


def test_a_bf16_recipe_checks_without_its_model(fresh, capsys):
    """The native engine's bf16 is judged from the zoo entry, not refused as 'config unknown'."""
    recipe = REPO / "recipes/qwen2.5-coder-1.5b/eagle3-tree-bf16.yaml"
    assert cli.main(["check", f"recipe={recipe}"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "config is unknown" not in shown and "native" in shown
