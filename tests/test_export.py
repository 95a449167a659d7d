"""`specpipe export`: golden files, and every key checked against the engine versions named.

The key lists below were read from the engines' sources at the versions the exporters name:
vLLM v0.11.0 (`vllm/config/speculative.py`, SpeculativeConfig, commit b8b302cde434) and SGLang
v0.5.6 (`python/sglang/srt/server_args.py`, commit 7ae368efde14). They are kept here, apart from
the exporters' own copies, so a typo in either shows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from specpipe.config import compose
from specpipe.export import sglang, vllm
from specpipe.export.plan import plan_of
from test_cli import specpipe

GOLDEN = Path(__file__).parent / "golden" / "export"

VLLM_0_11_0_SPECULATIVE_CONFIG_KEYS = [
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size", "disable_logprobs",
    "quantization", "max_model_len", "revision", "code_revision", "disable_by_batch_size",
    "disable_padded_drafter_batch", "prompt_lookup_max", "prompt_lookup_min", "speculative_token_tree",
]
VLLM_0_11_0_METHODS = ["ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp",
                       "ernie_mtp", "qwen3_next_mtp", "mimo_mtp", "longcat_flash_mtp", "mtp"]
SGLANG_0_5_6_SPECULATIVE_FLAGS = [
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
    "--speculative-draft-model-revision", "--speculative-draft-load-format", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc", "--speculative-token-map", "--speculative-attention-mode",
    "--speculative-moe-runner-backend", "--speculative-ngram-min-match-window-size",
    "--speculative-ngram-max-match-window-size", "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-match-type", "--speculative-ngram-branch-length",
    "--speculative-ngram-capacity",
]
SGLANG_0_5_6_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]

CASES = {
    "ngram": ["model=smollm2-135m", "proposer=ngram", "gamma=5"],
    "draft": ["model=qwen2.5-coder-1.5b", "proposer=draft", "gamma=4"],
    "twin": ["model=qwen2.5-coder-1.5b", "proposer=twin", "gamma=3"],
    "ngram-cost": ["model=smollm2-135m", "strategy=ngram-cost"],
    "plain": ["model=smollm2-135m", "proposer=none"],
    "ngram-batch-schedule": ["model=smollm2-135m", "proposer=ngram", "gamma=4", "batch_schedule={1: 3, 4: 2, 8: 0}"],
}


def exported(engine, case: str) -> dict:
    result = engine.export(plan_of(compose(CASES[case])))
    return {"settings": result.settings, "command": result.command, "warnings": result.warnings}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine", [vllm, sglang], ids=["vllm", "sglang"])
def test_golden(engine, case):
    got = exported(engine, case)
    path = GOLDEN / f"{engine.__name__.split('.')[-1]}-{case}.json"
    if os.environ.get("SPECPIPE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("case", CASES)
def test_vllm_keys_exist_in_v0_11_0(case):
    settings = exported(vllm, case)["settings"]
    assert set(settings) <= set(VLLM_0_11_0_SPECULATIVE_CONFIG_KEYS)
    if settings:
        assert settings["method"] in VLLM_0_11_0_METHODS  # the method is always explicit


@pytest.mark.parametrize("case", CASES)
def test_sglang_flags_exist_in_v0_5_6(case):
    settings = exported(sglang, case)["settings"]
    assert set(settings) <= set(SGLANG_0_5_6_SPECULATIVE_FLAGS)
    if settings:
        assert settings["--speculative-algorithm"] in SGLANG_0_5_6_ALGORITHMS


def test_adaptive_controller_exports_the_measured_mean_gamma_and_says_what_is_lost(tmp_path):
    recipe = tmp_path / "specpipe.yaml"
    recipe.write_text(yaml.safe_dump({"specpipe_recipe": 1, "target": "smollm2-135m",
                                      "strategy": {"proposer": "ngram", "controller": "cost", "gamma": 4},
                                      "measured": {"gamma_mean": 2.6}}))
    result = vllm.export(plan_of(compose([f"recipe={recipe}"])))
    assert result.settings["num_speculative_tokens"] == 3
    lost = [w for w in result.warnings if "controller=cost" in w]
    assert lost and "switching speculation off" in lost[0] and "mean γ its recipe measured" in lost[0]


def test_export_command_writes_the_config_and_prints_the_command(tmp_path):
    out = tmp_path / "spec.json"
    result = specpipe("export", "vllm", "model=smollm2-135m", "proposer=ngram", f"out={out}")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["method"] == "ngram"
    assert result.stdout.strip().startswith("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --speculative-config")
    result = specpipe("export", "sglang", "model=qwen2.5-coder-1.5b", "proposer=draft")
    assert "--speculative-algorithm STANDALONE" in result.stdout
    bad = specpipe("export", "tgi", "proposer=ngram")
    assert bad.returncode == 2 and "vllm, sglang" in bad.stderr


def test_medusa_exports_to_vllm_with_the_lm_head_and_is_refused_by_sglang(tmp_path):
    from safetensors.torch import load_file

    from conftest import VOCAB, tiny_model, tiny_tokenizer
    from specpipe.heads.io import read_config, save_medusa
    from specpipe.heads.medusa import MedusaHeads

    model = tiny_model(0, dtype=torch.float32)
    model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    save_medusa(MedusaHeads(32, VOCAB, 3), tmp_path / "heads", target=str(tmp_path / "target"))
    overrides = [f"model={tmp_path / 'target'}", "proposer=medusa", f"proposer.heads={tmp_path / 'heads'}"]
    result = specpipe("export", "vllm", *overrides, f"out={tmp_path / 'out' / 'spec.json'}")
    assert result.returncode == 0, result.stderr
    settings = json.loads((tmp_path / "out" / "spec.json").read_text())
    assert settings["method"] == "medusa" and settings["num_speculative_tokens"] == 3
    assert set(settings) <= set(VLLM_0_11_0_SPECULATIVE_CONFIG_KEYS)
    folder = Path(settings["model"])
    assert folder == (tmp_path / "out" / "medusa-vllm").resolve()
    weights = load_file(str(folder / "model.safetensors"))
    assert torch.equal(weights["lm_head.weight"], model.lm_head.weight.detach())
    assert "blocks.2.layers.0.weight" in weights and read_config(folder, "medusa")["original_lm_head"] is True
    sg = specpipe("export", "sglang", *overrides)
    assert sg.returncode == 0 and "has no Medusa" in sg.stderr and "--speculative" not in sg.stdout


def test_medusa_without_heads_is_one_clear_error():
    from test_cli import assert_user_error

    assert_user_error(specpipe("export", "vllm", "proposer=medusa"), "proposer.heads=DIR")


@pytest.mark.parametrize("tree", [None, "{top_k: 4, nodes: 12}"])
def test_eagle_exports_its_heads_folder_to_vllm_and_sglang(tmp_path, tree):
    from test_eagle import SHAPE
    from specpipe.heads.eagle import EagleHead
    from specpipe.heads.io import save_eagle

    save_eagle(EagleHead(SHAPE), tmp_path / "eagle", target="smollm2-135m")
    cfg = compose(["model=smollm2-135m", "proposer=eagle", f"proposer.heads={tmp_path / 'eagle'}", "gamma=5",
                   *([f"proposer.tree={tree}"] if tree else [])])
    v = vllm.export(plan_of(cfg))
    assert v.settings == {"method": "eagle", "model": str((tmp_path / "eagle").resolve()), "num_speculative_tokens": 5}
    assert set(v.settings) <= set(VLLM_0_11_0_SPECULATIVE_CONFIG_KEYS)
    assert any("dynamic tree" in w for w in v.warnings) == bool(tree)
    s = sglang.export(plan_of(cfg)).settings
    assert set(s) <= set(SGLANG_0_5_6_SPECULATIVE_FLAGS) and s["--speculative-algorithm"] == "EAGLE"
    assert s["--speculative-draft-model-path"] == str((tmp_path / "eagle").resolve())
    expected = (5, 4, 13) if tree else (5, 1, 6)  # steps, top-k, draft tokens (incl. the verified one)
    assert (s["--speculative-num-steps"], s["--speculative-eagle-topk"], s["--speculative-num-draft-tokens"]) == expected
