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
        assert config.architectures[0].lower().startswith(entry.architecture)


@pytest.mark.slow  # the real SmolLM2 (zoo); the Qwen models are judged the same way where they are fetched
def test_the_zoo_entry_is_the_models_own_config():
    """What check and export judge an unfetched model by is what the fetched model says of itself
    (its own config, read by transformers from the model's files), field by field."""
    from specpipe.models.loader import load_config, resolve, zoo_config

    for name, entry in zoo.ZOO.items():
        source = resolve(name, fetch=name == "smollm2-135m")
        if name != "smollm2-135m" and not source.is_dense_cached:
            continue
        own, judged = load_config(source), zoo_config(name)
        for key in [*entry.config, "vocab_size"]:
            want, got = getattr(own, key), getattr(judged, key)
            assert got == (pytest.approx(want, rel=1e-6) if isinstance(want, float) else want), (name, key)


def test_a_bf16_recipe_checks_without_its_model(fresh, capsys):
    """The native engine's bf16 is judged from the zoo entry, not refused as 'config unknown'."""
    recipe = REPO / "recipes/qwen2.5-coder-1.5b/eagle3-tree-bf16.yaml"
    assert cli.main(["check", f"recipe={recipe}"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "config is unknown" not in shown and "native" in shown


@pytest.mark.parametrize("tuned, device, precision, features, warned", [
    ({"device": "cpu", "cpu_features": ["avx2", "avx512", "amx"]}, "cpu", "bf16", ("avx2", "avx512"), "no AMX"),
    ({"device": "cpu", "cpu_features": ["avx2", "avx512", "amx"]}, "cpu", "fp16", ("avx2", "avx512"), None),
    ({"device": "cpu", "cpu_features": ["avx2", "avx512", "amx"]}, "cpu", "fp16", ("avx2",), "no AVX-512"),
    ({"device": "cpu", "cpu_features": ["avx2"]}, "cuda", "bf16", ("avx2",), "device=cuda"),
    ({"device": "cuda", "gpu": "NVIDIA H200"}, "cpu", "fp16", ("avx2",), "device=cpu"),
    ({"device": "cpu", "cpu_features": ["avx2"]}, "cpu", "bf16", ("avx2", "avx512", "amx"), None),  # more is fine
])
def test_what_changes_a_recipes_choice(tuned, device, precision, features, warned):
    from specpipe.checks.machine import differences

    found = differences(tuned, device, precision, features)
    assert (found[0] if found else None) == warned or warned in found[0]


def test_check_says_in_one_line_what_to_run_when_a_bf16_recipe_meets_a_cpu_without_amx(fresh, monkeypatch, capsys):
    from specpipe import machine

    monkeypatch.setattr(machine, "cpu_features", lambda: ("avx2", "avx512"))
    monkeypatch.setenv("COLUMNS", "400")  # the table's cells unwrapped
    recipe = REPO / "recipes/qwen2.5-coder-1.5b/eagle3-tree-bf16.yaml"
    assert cli.main(["check", f"recipe={recipe}"]) == 0  # a warning, not a refusal
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "tuned on warn" in shown and "no AMX" in shown
    assert "specpipe tune model=qwen2.5-coder-1.5b device=cpu" in shown


def test_a_cpu_recipe_on_cuda_is_warned(fresh):
    from specpipe.checks.machine import check_tuned_on
    from specpipe.config import compose
    from specpipe.settings import resolve

    cfg = compose([f"recipe={REPO / 'recipes/smollm2-135m/specpipe.yaml'}", "device=cuda"])
    found = check_tuned_on(cfg, resolve(cfg, fetch=False))
    assert found.status == "warn" and "device=cuda" in found.why and "AMD EPYC" in found.why
    assert found.fix == "specpipe tune model=smollm2-135m device=cuda"


def test_every_shipped_recipe_names_where_it_was_tuned():
    for path in RECIPES:
        tuned = yaml.safe_load(path.read_text())["measured"]["tuned_on"]
        assert {"device", "cpu", "cpu_features", "gpu", "precision", "date"} <= set(tuned), path
        assert set(tuned["cpu_features"]) <= {"avx2", "avx512", "amx"} and tuned["date"].startswith("2026-")


def test_generate_warns_in_one_line_on_a_machine_that_differs(tmp_path):
    """A recipe beside a model, tuned on a GPU: generate on the CPU says so, with the command."""
    from conftest import tiny_model, tiny_tokenizer

    tiny_model(0).save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "specpipe.yaml").write_text(yaml.safe_dump({
        "specpipe_recipe": 1, "target": ".", "strategy": {"proposer": "ngram", "gamma": 3},
        "measured": {"tuned_on": {"device": "cuda", "cpu": None, "cpu_features": [], "gpu": "NVIDIA H200",
                                  "precision": "bf16", "date": "2026-12-04"}}}))
    result = specpipe("generate", f"model={tmp_path / 'm'}", "prompt=w5 w17 w5", "max_new_tokens=4", "output=text")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stderr.split())  # one warning (rich folds it at the terminal's width)
    assert shown.count("warning: tuned on:") == 1 and "NVIDIA H200" in shown
    assert f"specpipe tune model={tmp_path / 'm'} device=cpu" in shown
