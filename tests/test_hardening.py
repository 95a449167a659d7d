"""Hardening: a stranger's recipe stays data, prompts are just text, `check` and
`export` refuse what `generate` refuses, every number is validated, JSON is strict.

The CLI cases run `specpipe` in a subprocess on tiny models saved to disk; the rules that live
in `compose` (recipes) run in process, through the same function the CLI calls.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from specpipe.build import config_checks
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from test_cli import assert_user_error, model_dirs, specpipe  # noqa: F401  (model_dirs: a fixture)

# texts a user types: commas, quotes, parentheses, interpolation syntax, `=`, newlines, non-ASCII
TEXTS = [
    "Hi, how are you?",
    "What's 2+2?",
    'print(f"{x}", end=\'\')  # (a, [b], {c})',
    "${oc.env:HOME} and ${now:%Y} stay as typed",
    "a=b, c = d; gamma=9",
    "naïve café, 日本語, emoji 🙂",
]
MULTILINE = "first line,\n  second (indented) line\n\nthird = 'last'"


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


# 2. Prompts are just text ------------------------------------------------------------------


def test_positional_prompts_reach_the_tokenizer_verbatim(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", *TEXTS, "output=json", "baseline=false",
                      "max_new_tokens=2")
    assert result.returncode == 0, result.stderr
    assert [r["prompt"] for r in strict_json(result.stdout)["requests"]] == TEXTS


def test_prompt_files_and_the_prompt_flag_are_taken_whole(model_dirs, tmp_path):
    files = []
    for i, text in enumerate([MULTILINE, TEXTS[2], TEXTS[3]]):
        files.append(tmp_path / f"p{i}.txt")
        files[-1].write_text(text + "\n\n", encoding="utf-8")  # trailing newlines are not the prompt
    args = [f"prompt_file={f}" for f in files] + [f"prompt={TEXTS[4]}", "--", "-5 is negative, right?"]
    result = specpipe("generate", f"model={model_dirs / 'target'}", "output=json", "baseline=false",
                      "max_new_tokens=2", *args)
    assert result.returncode == 0, result.stderr
    prompts = [r["prompt"] for r in strict_json(result.stdout)["requests"]]
    assert prompts == [MULTILINE, TEXTS[2], TEXTS[3], TEXTS[4], "-5 is negative, right?"]


def test_standard_input_is_one_prompt(model_dirs):
    result = subprocess.run([sys.executable, "-m", "specpipe", "generate", "-", f"model={model_dirs / 'target'}",
                             "output=json", "max_new_tokens=3"], input=MULTILINE + "\n" + TEXTS[5] + "\n",
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    out = strict_json(result.stdout)
    assert out["prompt"] == MULTILINE + "\n" + TEXTS[5] and out["greedy_equal"] is True


def test_unreadable_prompts_are_one_clear_error(model_dirs, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café".encode("latin-1"))
    for args, words in (([f"prompt_file={latin}"], ["not UTF-8", "iconv"]),
                        ([f"prompt_file={tmp_path / 'missing.txt'}"], ["cannot be read"]),
                        ([""], ["prompt is empty"])):
        assert_user_error(specpipe("generate", f"model={model_dirs / 'target'}", *args), *words)


def test_check_takes_prompts_as_generate_does(model_dirs):
    result = specpipe("check", f"model={model_dirs / 'target'}", TEXTS[0], TEXTS[4], "gamma=3")
    assert result.returncode == 0, result.stderr
    assert "2 prompt(s)" in " ".join(result.stdout.split())


# 1. A stranger's recipe or strategy is data -------------------------------------------------


def write_recipe(folder: Path, strategy: dict, target: str = "smollm2-135m", artifacts: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "specpipe.yaml").write_text(yaml.safe_dump(
        {"specpipe_recipe": 1, "target": target, "strategy": strategy, "artifacts": artifacts or {}}))
    return folder


@pytest.mark.parametrize("strategy, target, words", [
    ({"proposer": "draft", "proposer.model": "${oc.env:HOME}"}, "smollm2-135m", ["proposer.model", "interpolation"]),
    ({"proposer": "ngram", "controller.probe_every": "${oc.env:PATH}"}, "smollm2-135m", ["controller.probe_every"]),
    ({"proposer": "ngram", "proposer.ngram_max": ["${oc.decode:'4'}"]}, "smollm2-135m", ["proposer.ngram_max"]),
    ({"proposer": "ngram"}, "${oc.env:HOME}", ["target", "interpolation"]),
    ({"proposer": "draft", "proposer.model": "${oc.env:SPECPIPE_SECRET_FOR_TEST}"}, "smollm2-135m",
     ["proposer.model", "interpolation"]),
    ({"proposer": "ngram", "controller.probe_every": "${oc.env:SPECPIPE_SECRET_FOR_TEST}"}, "smollm2-135m",
     ["controller.probe_every"]),
    ({"proposer": "ngram"}, "${oc.env:SPECPIPE_SECRET_FOR_TEST}", ["target", "interpolation"]),
    ({"proposer": "draft", "proposer.model": "/etc"}, "smollm2-135m", ["proposer.model", "outside"]),
    ({"proposer": "medusa", "proposer.heads": "../elsewhere"}, "smollm2-135m", ["proposer.heads", "outside"]),
    ({"proposer": "medusa", "proposer.heads": "~/heads"}, "smollm2-135m", ["proposer.heads", "outside"]),
    ({"proposer": "eagle", "proposer.heads": "sub/../../x"}, "smollm2-135m", ["proposer.heads", "outside"]),
    ({"proposer": "ngram"}, "/opt/some/model", ["target", "outside", "model=PATH"]),
    ({"proposer": "ngram"}, "../model", ["target", "outside"]),
])
def test_a_recipe_is_data_and_stays_in_its_folder(tmp_path, monkeypatch, strategy, target, words):
    """A recipe's `${...}` is refused, never resolved: no environment variable's value (a secret's,
    the home folder) reaches the message."""
    monkeypatch.setenv("SPECPIPE_SECRET_FOR_TEST", "s3cr3t-f7e2")
    recipe = write_recipe(tmp_path / "recipe", strategy, target)
    with pytest.raises(SpecpipeError) as err:
        compose([f"recipe={recipe}"])
    message = str(err.value)
    assert all(word in message for word in words), message
    assert "s3cr3t-f7e2" not in message and str(Path.home()) + "/" not in message


def test_a_model_folder_recipe_and_a_strategy_file_obey_the_same_rules(tmp_path):
    beside = write_recipe(tmp_path / "model", {"proposer": "draft", "proposer.model": "/root"}, target=".")
    with pytest.raises(SpecpipeError, match="proposer.model"):
        compose([f"model={beside}"])
    strategy = tmp_path / "s.yaml"
    strategy.write_text(yaml.safe_dump({"proposer": "draft", "proposer.model": "${oc.env:HOME}"}))
    with pytest.raises(SpecpipeError, match="interpolation"):
        compose([f"strategy={strategy}"])
    strategy.write_text(yaml.safe_dump({"proposer": "medusa", "proposer.heads": str(tmp_path)}))
    with pytest.raises(SpecpipeError, match="outside"):
        compose([f"strategy={strategy}"])


def test_paths_inside_the_folder_zoo_names_and_hub_ids_are_kept(tmp_path):
    folder = tmp_path / "recipe"
    (folder / "heads").mkdir(parents=True)
    recipe = write_recipe(folder, {"proposer": "medusa", "proposer.heads": "heads"})
    assert compose([f"recipe={recipe}"]).proposer.heads == str((folder / "heads").resolve())
    hub = write_recipe(tmp_path / "hub", {"proposer": "draft", "proposer.model": "HuggingFaceTB/SmolLM2-135M"},
                       target="qwen2.5-coder-1.5b")
    cfg = compose([f"recipe={hub}"])
    assert cfg.proposer.model == "HuggingFaceTB/SmolLM2-135M" and cfg.model.name == "qwen2.5-coder-1.5b"
    outside = write_recipe(tmp_path / "mine", {"proposer": "ngram"}, target="/opt/some/model")
    assert compose([f"recipe={outside}", "model=/opt/some/model"]).model.name == "/opt/some/model"  # the user's word


# 4 and 5. One validation path; every number and option checked -----------------------------

BAD_SETTINGS = [
    (["temperature=nan", "verifier=rejection"], "temperature=nan"),
    (["top_p=inf", "verifier=rejection", "temperature=0.5"], "top_p=inf"),
    (["verifier=typical", "verifier.epsilon=nan"], "verifier.epsilon=nan"),
    (["controller=cost", "controller.smoothing=-inf"], "controller.smoothing=-inf"),
    (["controller=band", "controller.low=0.9"], "low"),
    (["controller=cost", "controller.window=abc"], "controller.window='abc'"),
    (["proposer.ngram_max=abc"], "proposer.ngram_max='abc'"),
    (["proposer.ngram_min=2.5"], "proposer.ngram_min=2.5"),
    (["proposer=medusa", "proposer.heads=/x", "proposer.tree=abc"], "proposer.tree='abc'"),
    (["proposer=medusa", "proposer.heads=/x", "proposer.tree=[[0],[a]]"], "proposer.tree"),
    (["proposer=eagle", "proposer.heads=/x", "proposer.tree={top_k: 2, nodes: x}"], "proposer.tree"),
    (["gamma=12"], "gamma_max"),
    (["gamma=2", "gamma_min=3"], "gamma_min=3"),
    (["max_new_tokens=0"], "max_new_tokens=0"),
    (["cache_len=0"], "cache_len=0"),
    (["output=xml"], "output=xml"),
    (["batch=-1"], "batch=-1"),
    (["model.chat=maybe"], "model.chat='maybe'"),
    (["model.early_exit=99", "proposer=none"], "early_exit=99"),
    (["model.early_exit=0", "proposer=none"], "early_exit=0"),
    (["model.lora=/no/such/adapter"], "model.lora=/no/such/adapter"),
]


@pytest.mark.parametrize("args, words", BAD_SETTINGS)
def test_check_and_generate_refuse_the_same_settings_before_weights(args, words, model_dirs, monkeypatch):
    cfg = compose([f"model={model_dirs / 'target'}", *args])
    refused = [c for c in config_checks(cfg) if c.status == "refuse"]
    assert refused and any(words in c.why for c in refused), refused
    import specpipe.build

    monkeypatch.setattr(specpipe.build, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(SpecpipeError, match=words.replace("[", r"\[").replace("+", r"\+")):
        Pipeline.from_config(cfg)


def test_the_cli_refuses_them_in_check_generate_and_export(model_dirs):
    def refused(result, word):  # check prints its table (stdout), the others one paragraph (stderr)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert word in " ".join((result.stdout + result.stderr).split())

    target = f"model={model_dirs / 'target'}"
    for command in (["check"], ["generate"], ["export", "vllm"]):
        refused(specpipe(*command, target, "temperature=nan", "verifier=rejection"), "temperature=nan")
    disjoint = [target, "proposer=draft", f"proposer.model={_disjoint_draft(model_dirs)}"]
    for command in (["check"], ["export", "vllm"], ["export", "sglang"]):
        refused(specpipe(*command, *disjoint), "shares no token text")


def _disjoint_draft(model_dirs):
    """A draft whose tokenizer has not one token text in common with the target's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from conftest import VOCAB, tiny_model

    folder = model_dirs / "disjoint"
    if not folder.exists():
        words = Tokenizer(models.WordLevel(vocab={f"zz{i}": i for i in range(VOCAB)}, unk_token="zz0"))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tiny_model(9, dtype=torch.float32).save_pretrained(folder)
        PreTrainedTokenizerFast(tokenizer_object=words, eos_token="zz1", unk_token="zz0").save_pretrained(folder)
    return folder


@pytest.mark.full  # two CLI runs; the exports themselves are golden files in CI (test_export)
def test_a_draft_with_another_tokenizer_is_checked_and_exported(model_dirs):
    alien = [f"model={model_dirs / 'target'}", "proposer=draft", f"proposer.model={model_dirs / 'alien'}"]
    vllm = specpipe("export", "vllm", *alien, "engine_version=0.33.0", f"out={model_dirs / 'alien-export' / 'spec.json'}")
    assert vllm.returncode == 0, vllm.stderr  # vLLM 0.33.0 serves it (TLI); 0.34.0 serves the plain target
    assert json.loads((model_dirs / "alien-export" / "spec.json").read_text())["use_heterogeneous_vocab"] is True
    sglang = specpipe("export", "sglang", *alien)
    assert sglang.returncode == 0 and "refuses a draft whose vocabulary differs" in " ".join(sglang.stderr.split())


def test_generate_json_is_strict(model_dirs):
    """A run where nothing is drafted (ngram on a prompt without repeats) has figures of nothing."""
    result = specpipe("generate", f"model={model_dirs / 'target'}", "w5 w9", "output=json", "max_new_tokens=1",
                      "baseline=false")
    assert result.returncode == 0, result.stderr
    out = strict_json(result.stdout)
    assert all(not isinstance(v, float) or math.isfinite(v) for v in out.values())


def test_jsonsafe_writes_null_for_what_is_not_a_number():
    from specpipe import jsonsafe

    text = jsonsafe.dumps({"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}], "d": 2})
    assert strict_json(text) == {"a": None, "b": [1.0, None, {"c": None}], "d": 2}


@pytest.mark.parametrize("bad, words", [("lr=nan", "lr=nan"), ("held_out=1.5", "held_out=1.5"), ("epochs=0", "epochs=0"),
                                        ("batch=0", "batch=0"), ("distill_batch=0", "distill_batch=0"),
                                        ("lr=-0.1", "lr=-0.1"), ("dtype=int4", "dtype=int4")])
def test_train_settings_are_refused_before_anything_loads(bad, words, monkeypatch):
    from specpipe.commands import train

    monkeypatch.setattr(train, "resolve", lambda *a, **k: pytest.fail("the model was resolved"))
    with pytest.raises(SpecpipeError, match=words):
        train.run(compose(["proposer=medusa", bad], "train"))
