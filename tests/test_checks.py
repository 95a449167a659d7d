"""Compatibility checks with real peft LoRA adapters on tiny models, through `specpipe check`;
and the engine's refusals, which the check reports in the words the run raises them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import tiny_model, tiny_tokenizer
from specpipe.config import compose
from specpipe.pipeline import Pipeline
from test_cli import assert_user_error, specpipe


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    tokenizer = tiny_tokenizer()
    for name, seed in (("target", 0), ("draft", 3)):
        model = tiny_model(seed, dtype=torch.float32)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    for i in range(2):
        torch.manual_seed(10 + i)
        config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                            init_lora_weights=False)  # random B: the adapter really changes outputs
        get_peft_model(tiny_model(0, dtype=torch.float32), config).save_pretrained(root / f"lora{i}")
    return root


def check(dirs, *args):
    return specpipe("check", f"model={dirs / 'target'}", *args)


def test_one_adapter_is_merged_before_the_twin(dirs):
    result = check(dirs, f"model.lora={dirs / 'lora0'}", "proposer=twin")
    assert result.returncode == 0, result.stderr
    assert "merge" in result.stdout and "quantize" in result.stdout


def test_independent_draft_with_an_adapter_warns(dirs):
    result = check(dirs, f"model.lora={dirs / 'lora0'}", "proposer=draft", f"proposer.model={dirs / 'draft'}")
    assert result.returncode == 0, result.stderr
    assert "warn" in result.stdout and "acceptance" in result.stdout


@pytest.mark.parametrize("proposer, code", [("draft", 2), ("twin", 2), ("ngram", 0)])
def test_several_adapters_refuse_model_proposers(dirs, proposer, code):
    lora = f"model.lora=['{dirs / 'lora0'}','{dirs / 'lora1'}']"
    extra = [f"proposer.model={dirs / 'draft'}"] if proposer == "draft" else []
    result = check(dirs, lora, f"proposer={proposer}", *extra)
    assert result.returncode == code, result.stdout + result.stderr
    assert ("refuse" in result.stdout) == (code == 2)


def test_early_exit_refused_with_speculation(dirs):
    result = check(dirs, "model.early_exit=1", "proposer=twin")
    assert result.returncode == 2 and "refuse" in result.stdout
    assert check(dirs, "model.early_exit=1", "proposer=none").returncode == 0
    assert_user_error(specpipe("generate", f"model={dirs / 'target'}", "model.early_exit=1", "proposer=ngram"),
                      "early exit", "proposer=none")


def test_twin_of_a_merged_adapter_keeps_greedy_output(dirs):
    cfg = compose([f"model={dirs / 'target'}", f"model.lora={dirs / 'lora0'}", "proposer=twin", "gamma=3"])
    pipeline = Pipeline.from_config(cfg)
    prompt = [5, 17, 33, 2, 9]
    spec = pipeline.run(prompt, max_new_tokens=24)
    plain = pipeline.run(prompt, max_new_tokens=24, speculative=False)
    assert spec.token_ids == plain.token_ids
    base = Pipeline.from_config(compose([f"model={dirs / 'target'}", "proposer=none"]))
    assert base.run(prompt, max_new_tokens=24).token_ids != plain.token_ids  # the adapter matters


ENGINE_REFUSALS = [  # (settings, whether the model is one the native engine cannot run)
    (["engine=vllm"], False), (["graphs=sometimes"], False), (["kernels=fastest"], False),
    (["engine=native"], True), (["engine=hf", "model.quantize=bf16"], False), (["model.quantize=bf16"], True),
    (["engine=hf", "graphs=on"], False), (["graphs=on"], True), (["engine=hf", "compile=true"], False),
    (["engine=hf", "device=cuda"], False),
    (["engine=llamacpp", "graphs=on"], False), (["engine=llamacpp", "compile=true"], False),
]


@pytest.mark.parametrize("settings, foreign", ENGINE_REFUSALS)
def test_the_check_reports_what_the_run_raises(settings, foreign):
    """Each engine rule is one function of the engine package: `specpipe check` reports the
    refusal `make_runner` raises for the same settings, in the same words (the check names the
    model where the run says `this model`)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from specpipe.checks.llamacpp import _engine
    from specpipe.checks.target import check_engine
    from specpipe.engine import Refusal, make_runner
    from specpipe.errors import SpecpipeError
    from specpipe.settings import resolve

    model = (GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval() if foreign
             else tiny_model(0))
    cfg = compose(["proposer=ngram", *settings])
    s = resolve(cfg, fetch=False, target_config=model.config)
    if s.engine_choice == "llamacpp":  # its rules sit in the llama.cpp check; the run is handed the GGUF's path
        model, checks = Path("model.gguf"), [_engine(s, None, Path("model.gguf"))]
    else:
        checks = check_engine(s)
    refused = [c for c in checks if c.status == "refuse"]
    assert len(refused) == 1, checks
    sentence = str(Refusal(refused[0].why, refused[0].fix)).replace(s.model, "this model")
    with pytest.raises(SpecpipeError) as raised:
        make_runner(model, engine=s.engine_choice, precision=s.precision, device=s.device, compile=s.compile,
                    kernels=s.kernels, graphs=s.graphs)
    assert str(raised.value) == sentence


def test_a_missing_llama_cpp_is_said_alike_by_the_check_and_the_run(monkeypatch):
    """The library rule is one function of the engine package (`library_refusal`): `specpipe check`
    reports it and `make_runner` raises it, in the same words."""
    import sys

    from specpipe.checks.llamacpp import check_llamacpp
    from specpipe.engine import Refusal, make_runner
    from specpipe.errors import SpecpipeError
    from specpipe.settings import resolve

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` fails, as where it is not installed
    cfg = compose(["engine=llamacpp", "proposer=ngram"])
    (refused,) = [c for c in check_llamacpp(cfg, resolve(cfg, fetch=False)) if c.status == "refuse"]
    with pytest.raises(SpecpipeError) as raised:
        make_runner(Path("model.gguf"), engine="llamacpp")
    assert str(raised.value) == str(Refusal(refused.why, refused.fix))
