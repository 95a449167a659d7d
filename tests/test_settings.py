"""The configuration resolved once (specpipe/settings.py): a frozen value, and the one that both
`specpipe check` and the build read, so the engine and precision a check reports are the ones
that run, `auto` cases included."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import tiny_model, tiny_tokenizer
from specpipe import build
from specpipe.commands import check
from specpipe.config import compose
from specpipe.models.quantize import BY_DEVICE
from specpipe.pipeline import Pipeline
from specpipe.settings import Settings, resolve
from test_cli import model_dirs  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """A model the native engine does not run (a Llama whose activation it does not compute):
    engine=auto resolves to hf for it."""
    root = tmp_path_factory.mktemp("foreign")
    model = tiny_model(0, dtype=torch.float32)
    model.config.hidden_act = "relu"
    model.save_pretrained(root)
    tiny_tokenizer().save_pretrained(root)
    return root


def seen(monkeypatch) -> list[Settings]:
    """The settings every run of the checks is handed, in order (the check's, then the build's)."""
    handed = []
    real = build.run_checks

    def spy(cfg, settings, *loaders):
        handed.append(settings)
        return real(cfg, settings, *loaders)

    monkeypatch.setattr(build, "run_checks", spy)
    return handed


def test_the_settings_are_frozen(model_dirs):
    settings = resolve(compose([f"model={model_dirs / 'target'}", "proposer=ngram"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.engine = "hf"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.draft.engine = "hf"


CASES = [  # (model: target | foreign, settings, the engine that runs, the precision that runs)
    ("target", [], "native", "none"),
    ("target", ["engine=auto", "model.quantize=auto"], "native", BY_DEVICE["cpu"]),
    ("target", ["engine=hf"], "hf", "none"),
    ("target", ["engine=hf", "model.quantize=auto"], "hf", BY_DEVICE["cpu"]),
    ("target", ["model.quantize=bf16"], "native", "bf16"),
    ("foreign", ["engine=auto"], "hf", "none"),
    ("foreign", ["model.quantize=auto"], "hf", BY_DEVICE["cpu"]),
]


@pytest.mark.parametrize("model, settings, engine, precision", CASES)
def test_check_and_build_see_the_same_engine_and_precision(model_dirs, foreign, monkeypatch, capsys, model, settings,
                                                           engine, precision):
    path = model_dirs / "target" if model == "target" else foreign
    handed = seen(monkeypatch)
    cfg = compose([f"model={path}", "proposer=ngram", *settings])
    assert check.run(cfg) == 0, capsys.readouterr().out
    pipeline = Pipeline.from_config(cfg)
    checked, built = handed
    assert (checked.engine, checked.precision) == (built.engine, built.precision) == (engine, precision)
    assert (pipeline.runner.engine, pipeline.runner.precision) == (engine, precision)  # what runs
    table = " ".join(capsys.readouterr().out.split())
    assert f"engine │ ok │ {engine}" in table  # what the check reported


def test_a_draft_runs_on_the_engine_its_check_reads(model_dirs, monkeypatch, capsys):
    """The draft model's engine is resolved once too: the batch check reads it, the build runs it."""
    handed = seen(monkeypatch)
    cfg = compose([f"model={model_dirs / 'target'}", "proposer=draft", f"proposer.model={model_dirs / 'draft'}",
                   "proposer.quantize=auto"])
    assert check.run(cfg) == 0
    pipeline = Pipeline.from_config(cfg)
    checked, built = handed
    assert checked.draft == built.draft
    assert (built.draft.engine, built.draft.precision) == ("native", BY_DEVICE["cpu"])
    assert pipeline.proposer.runner.engine == built.draft.engine


def test_the_commands_resolve_once(model_dirs, monkeypatch, capsys):
    """generate resolves the settings once and hands the same value to the checks and the build."""
    from specpipe import settings as module
    from specpipe.commands import generate

    made = []
    real = module.resolve

    def counting(cfg, **kwargs):
        made.append(real(cfg, **kwargs))
        return made[-1]

    monkeypatch.setattr(build, "resolve", counting)
    handed = seen(monkeypatch)
    cfg = compose([f"model={model_dirs / 'target'}", "proposer=ngram", "max_new_tokens=4", "output=text",
                   "baseline=false"], "generate")
    generate.run(cfg, ["w5 w17"])
    assert len(made) == 1 and handed == made and handed[0] is made[0]


def test_a_value_nobody_runs_is_kept_for_its_rule(model_dirs):
    """The resolver decides nothing about a value no engine takes: the rule that concerns it does."""
    settings = resolve(compose([f"model={model_dirs / 'target'}", "engine=vllm", "device=tpu"]), fetch=False)
    assert (settings.engine, settings.device, settings.overlapped) == ("vllm", "tpu", False)


def test_compose_writes_the_precision_the_settings_resolve(model_dirs):
    cfg = compose([f"model={model_dirs / 'target'}", "model.quantize=auto", "proposer=twin", "proposer.quantize=auto"])
    settings = resolve(cfg)
    assert (cfg.model.quantize, cfg.proposer.quantize) == (settings.precision, settings.draft.precision)
    assert torch.device(settings.device).type == "cpu"


REFUSED = [  # settings a rule refuses before any weights load, each a rule of its own module
    ["model.early_exit=1", "proposer=ngram"],
    ["model.quantize=int8", "proposer=ngram"],
    ["engine=hf", "graphs=on", "proposer=ngram"],
    ["engine=native", "kernels=fastest", "proposer=ngram"],
    ["verifier=greedy", "temperature=0.7", "proposer=ngram"],
    ["device=cuda", "engine=hf", "proposer=ngram"],
]


@pytest.mark.parametrize("settings", REFUSED)
def test_the_run_raises_the_words_the_check_reports(model_dirs, settings):
    """A refusal is said once: the build raises the check's own why and fix (the row `specpipe check`
    shows), not a sentence of its own."""
    from specpipe.build import config_checks
    from specpipe.errors import SpecpipeError

    cfg = compose([f"model={model_dirs / 'target'}", *settings])
    refused = [c for c in config_checks(cfg, resolve(cfg, fetch=False)) if c.status == "refuse"]
    assert refused, settings
    with pytest.raises(SpecpipeError) as raised:
        Pipeline.from_config(cfg)
    first = refused[0]
    assert str(raised.value) == f"{first.name}: {first.why.rstrip('.')}." + (f" Fix: {first.fix}." if first.fix else "")
