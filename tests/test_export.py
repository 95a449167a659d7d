"""`specpipe export`: golden files for every proposer × engine, and every key checked against
the engine versions named.

The vLLM key lists below were read from the engines' released packages at the versions the
exporters name: vLLM 0.34.0 and 0.33.0 (`vllm/config/speculative.py` of each wheel:
SpeculativeConfig's user-settable fields and SpeculativeMethod). They are kept here, apart from
the exporters' own copies, so a typo in either shows. Where the vLLM wheels are at hand
($SPECPIPE_VLLM_WHEELS, see vllm_wheel.py), vLLM's own SpeculativeConfig of each version
validates every golden export of that version. SGLang's flags and algorithms are read from the
0.5.23 wheel itself ($SPECPIPE_SGLANG_WHEELS, see sglang_wheel.py: the `Spec` namespace of
`sglang/srt/arg_groups/fields/spec.py` its parser is built from), never from a copy.
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
REPO = Path(__file__).resolve().parents[1]

VLLM_0_33_0_SPECULATIVE_CONFIG_KEYS = [
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size", "quantization",
    "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len", "revision", "code_revision",
    "index_share_for_mtp_iteration", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "draft_lm_head_quantization", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_load_config",
    "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc", "fly_window_size",
    "fly_entropy_threshold", "fly_entropy_top_k",
]
VLLM_0_34_0_SPECULATIVE_CONFIG_KEYS = [
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "draft_decode_context_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
    "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "draft_lm_head_quantization", "use_local_argmax_reduction",
    "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting", "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_corpus_tokens",
    "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_load_config",
    "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc", "speculator_options",
    "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k",
]  # tensor_parallel_size is a field only to refuse it; custom_method is set by vLLM
VLLM_0_34_0_METHODS = ["ngram", "draft_model", "suffix", "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash",
                       "ngram_gpu", "dspark"]  # plus 29 model-specific *_mtp names; custom_class is gone
VLLM_0_33_0_METHODS = ["ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states",
                       "mtp", "dflash", "ngram_gpu", "dspark"]  # plus 27 model-specific *_mtp names
CASES = {
    "ngram": ["model=smollm2-135m", "proposer=ngram", "gamma=5"],
    "suffix": ["model=smollm2-135m", "proposer=suffix", "gamma=12"],
    "suffix-chain": ["model=smollm2-135m", "proposer=suffix", "gamma=8", "proposer.tree=false",
                     "proposer.max_cached_requests=0", "proposer.max_spec_offset=2.0"],
    "draft": ["model=qwen2.5-coder-1.5b", "proposer=draft", "gamma=4"],
    "draft-other-tokenizer": ["model=qwen2.5-coder-1.5b", "proposer=draft", "proposer.model=smollm2-135m", "gamma=4"],
    "draft-other-tokenizer-fallback": ["model=qwen2.5-coder-1.5b", "proposer=draft", "proposer.model=smollm2-135m",
                                       "proposer.fallback_model=qwen2.5-coder-0.5b", "gamma=4"],
    "twin": ["model=qwen2.5-coder-1.5b", "proposer=twin", "gamma=3"],
    "twin-fp16": ["model=qwen2.5-coder-1.5b", "proposer=twin", "proposer.quantize=fp16", "gamma=3"],
    "ngram-cost": ["model=smollm2-135m", "strategy=ngram-cost"],
    "plain": ["model=smollm2-135m", "proposer=none"],
    "ngram-batch-schedule": ["model=smollm2-135m", "proposer=ngram", "gamma=4", "batch_schedule={1: 3, 4: 2, 8: 0}"],
    "suffix-batch-schedule": ["model=smollm2-135m", "proposer=suffix", "gamma=6", "batch_schedule={2: 4, 8: 0}"],
    "eagle": [f"recipe={REPO / 'recipes/smollm2-135m/eagle.yaml'}", "gamma=5"],
    "eagle-tree": [f"recipe={REPO / 'recipes/smollm2-135m/eagle.yaml'}", "gamma=5", "proposer.tree={top_k: 4, nodes: 12}"],
    "medusa": [f"recipe={REPO / 'recipes/smollm2-135m/medusa.yaml'}"],
    "eagle3": [f"recipe={REPO / 'recipes/smollm2-135m/eagle3.yaml'}", "gamma=5"],
    "eagle3-tree": [f"recipe={REPO / 'recipes/smollm2-135m/eagle3.yaml'}", "gamma=5", "proposer.tree={top_k: 4, nodes: 12}"],
    # a tiny random DFlash drafter in z-lab's format (block 8): export reads its config and checks its files
    "dflash": ["model=smollm2-135m", "proposer=dflash", f"proposer.heads={REPO / 'tests/golden/dflash-drafter'}",
               "gamma=5", "controller=fixed"],
    "dflash-past-its-block": ["model=smollm2-135m", "proposer=dflash", "gamma=9", "controller=fixed",
                              f"proposer.heads={REPO / 'tests/golden/dflash-drafter'}", "proposer.lookup=suffix"],
    "eagle3-block": [f"recipe={REPO / 'recipes/smollm2-135m/eagle3.yaml'}", "gamma=5", "verifier=block",
                     "temperature=0.7"],
    "twin-block": ["model=qwen2.5-coder-1.5b", "proposer=twin", "gamma=3", "verifier=block", "temperature=0.7"],
    "suffix-block": ["model=smollm2-135m", "proposer=suffix", "gamma=8", "verifier=block", "temperature=0.7"],
}
# (engine module, version, golden file prefix): vLLM's default version has the plain prefix
TARGETS = [(vllm, "0.34.0", "vllm"), (vllm, "0.33.0", "vllm-0.33.0"), (sglang, "0.5.23", "sglang")]
VLLM_KEYS = {"0.34.0": VLLM_0_34_0_SPECULATIVE_CONFIG_KEYS, "0.33.0": VLLM_0_33_0_SPECULATIVE_CONFIG_KEYS}
VLLM_METHODS = {"0.34.0": VLLM_0_34_0_METHODS, "0.33.0": VLLM_0_33_0_METHODS}


def exported(engine, case: str, version: str | None = None) -> dict:
    """The export of a case, the repository's own path written <repo> (the heads of shipped recipes)."""
    result = engine.export(plan_of(compose(CASES[case])), version)
    text = json.dumps({"settings": result.settings, "command": result.command, "warnings": result.warnings})
    return json.loads(text.replace(str(REPO), "<repo>"))


def golden(prefix: str, case: str) -> Path:
    return GOLDEN / f"{prefix}-{case}.json"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine, version, prefix", TARGETS, ids=[t[2] for t in TARGETS])
def test_golden(engine, version, prefix, case):
    got = exported(engine, case, version)
    path = golden(prefix, case)
    if os.environ.get("SPECPIPE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version", VLLM_KEYS)
def test_vllm_keys_exist_in_the_version_named(case, version):
    settings = exported(vllm, case, version)["settings"]
    assert set(settings) <= set(VLLM_KEYS[version])
    if settings:
        assert settings["method"] in VLLM_METHODS[version]  # the method is always explicit


def test_the_exporters_key_lists_are_the_wheels():
    for version, keys in VLLM_KEYS.items():
        assert vllm.VERSIONS[version].keys == tuple(keys)
        assert vllm.VERSIONS[version].methods == tuple(VLLM_METHODS[version])


@pytest.mark.parametrize("version", VLLM_KEYS)
def test_the_key_lists_are_read_from_vllms_own_config(tmp_path_factory, version):
    """The lists above (and so the exporters') against the released wheel itself: every key a
    field of its SpeculativeConfig, every method one of its SpeculativeMethod."""
    from vllm_wheel import speculative_config, unpack, wheel

    whl = wheel(version)
    if whl is None:
        pytest.skip(f"no vllm-{version} wheel in $SPECPIPE_VLLM_WHEELS (pip download --no-deps vllm=={version} -d DIR)")
    own = speculative_config(unpack(whl, tmp_path_factory.mktemp(f"vllm-{version}")))
    assert set(VLLM_KEYS[version]) <= set(own["fields"]), set(VLLM_KEYS[version]) - set(own["fields"])
    assert set(VLLM_METHODS[version]) <= set(own["methods"]), set(VLLM_METHODS[version]) - set(own["methods"])


@pytest.fixture(scope="module")
def sglang_parser() -> tuple[dict, set[str]]:
    """The arguments (by flag) and algorithm names of SGLang 0.5.23's own parser, read from the
    released wheel (sglang_wheel.py)."""
    from sglang_wheel import algorithms, arguments, wheel

    whl = wheel(sglang.VERSION)
    fill = f"pip download --no-deps --only-binary=:all: sglang=={sglang.VERSION} -d DIR"
    if whl is None and os.environ.get("SPECPIPE_SGLANG_WHEELS"):  # named (as CI does) but empty: not a skip
        pytest.fail(f"no sglang-{sglang.VERSION} wheel in $SPECPIPE_SGLANG_WHEELS ({fill})")
    if whl is None:
        pytest.skip(f"no sglang-{sglang.VERSION} wheel: $SPECPIPE_SGLANG_WHEELS is not set ({fill})")
    return arguments(whl), algorithms(whl)


@pytest.mark.parametrize("case", CASES)
def test_sglang_flags_exist_in_v0_5_23(case, sglang_parser):
    """Every flag an export writes is an argument of the wheel's parser, with a value that
    argument takes (a switch bare, an int an int, one of its choices), and the algorithm one the
    wheel knows."""
    own, names = sglang_parser
    settings = exported(sglang, case)["settings"]
    assert set(settings) <= set(own), set(settings) - set(own)
    refused = {flag: own[flag].refuses(value) for flag, value in settings.items() if own[flag].refuses(value)}
    assert not refused
    if settings:
        assert settings["--speculative-algorithm"] in names, (settings["--speculative-algorithm"], sorted(names))


def test_the_sglang_exporters_lists_are_the_wheels(sglang_parser):
    """The exporter's FLAGS and ALGORITHMS (what it may write at all) against the wheel itself."""
    own, names = sglang_parser
    assert set(sglang.FLAGS) <= set(own), set(sglang.FLAGS) - set(own)
    assert set(sglang.ALGORITHMS) <= names, set(sglang.ALGORITHMS) - names


@pytest.mark.parametrize("case", CASES)
def test_sglang_chains_draft_steps_plus_one_tokens(case):
    settings = exported(sglang, case)["settings"]
    if settings.get("--speculative-eagle-topk") == 1:  # SGLang forces a chain's draft tokens to steps + 1
        assert settings["--speculative-num-draft-tokens"] == settings["--speculative-num-steps"] + 1


@pytest.mark.parametrize("version", VLLM_KEYS)
def test_vllms_own_speculative_config_validates_every_golden_export(tmp_path_factory, version):
    """vLLM's SpeculativeConfig, from the released wheel of each version, accepts what specpipe
    writes for it (the golden files: every proposer, schedule and fallback)."""
    from vllm_wheel import unpack, validate, wheel

    whl = wheel(version)
    if whl is None:
        pytest.skip(f"no vllm-{version} wheel in $SPECPIPE_VLLM_WHEELS (pip download --no-deps vllm=={version} -d DIR)")
    prefix = dict((v, p) for _, v, p in TARGETS if _ is vllm)[version]
    settings = {case: json.loads(golden(prefix, case).read_text())["settings"] for case in CASES}
    settings = {case: s for case, s in settings.items() if s}  # the plain target has nothing to validate
    verdicts = validate(unpack(whl, tmp_path_factory.mktemp(f"vllm-{version}")), list(settings.values()))
    refused = {case: verdict for case, verdict in zip(settings, verdicts) if verdict and "skipped" not in verdict}
    assert not refused
    judged = {case for case, verdict in zip(settings, verdicts) if verdict is None}
    assert {"ngram", "ngram-cost", "ngram-batch-schedule"} <= judged
    if version == vllm.VERSION:  # 0.34 judges suffix natively, and model methods without their checkpoint
        assert {"suffix", "suffix-chain", "suffix-batch-schedule", "draft", "draft-other-tokenizer-fallback",
                "twin", "twin-fp16", "eagle", "eagle-tree", "eagle3", "eagle3-tree"} <= judged


def test_block_verification_exports_to_each_engines_own_setting():
    """verifier=block: vLLM's `rejection_sample_method: block` wherever its V2 model runner verifies
    (every method in 0.34.0; not suffix in 0.33.0, said so), SGLang's switch, written bare, for its
    EAGLE family only (other algorithms refuse it: not written, said so)."""
    assert exported(vllm, "twin-block")["settings"]["rejection_sample_method"] == "block"
    assert exported(vllm, "suffix-block")["settings"]["rejection_sample_method"] == "block"
    old = exported(vllm, "suffix-block", "0.33.0")
    assert "rejection_sample_method" not in old["settings"] and any("V1 model runner" in w for w in old["warnings"])
    eagle = exported(sglang, "eagle3-block")
    assert eagle["settings"]["--speculative-use-block-verification"] is True
    assert eagle["command"].endswith("--speculative-use-block-verification")
    twin = exported(sglang, "twin-block")
    assert "--speculative-use-block-verification" not in twin["settings"]
    assert any("verifier=block" in w and "STANDALONE" in w for w in twin["warnings"])
    assert "rejection_sample_method" not in exported(vllm, "twin")["settings"]  # the engines' default otherwise


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


def test_medusa_serves_the_plain_target_and_says_the_heads_are_lost(tmp_path):
    """Neither vLLM 0.33.0 nor SGLang 0.5.23 has Medusa: nothing half-right is written."""
    from conftest import VOCAB, tiny_model, tiny_tokenizer
    from specpipe.heads.io import save_medusa
    from specpipe.heads.medusa import MedusaHeads

    tiny_model(0, dtype=torch.float32).save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    save_medusa(MedusaHeads(32, VOCAB, 3), tmp_path / "heads", target=str(tmp_path / "target"))
    overrides = [f"model={tmp_path / 'target'}", "proposer=medusa", f"proposer.heads={tmp_path / 'heads'}"]
    for engine in ("vllm", "sglang"):
        result = specpipe("export", engine, *overrides, f"out={tmp_path / engine / 'spec.json'}")
        assert result.returncode == 0, result.stderr
        assert "has no Medusa" in result.stderr and "--speculative" not in result.stdout
        assert "proposer=eagle" in result.stderr  # what to use instead
    assert "speculative" not in (tmp_path / "vllm" / "spec.json").read_text()  # the plain serve command only


def test_medusa_without_heads_is_one_clear_error():
    from test_cli import assert_user_error

    assert_user_error(specpipe("export", "vllm", "proposer=medusa"), "proposer.heads=DIR")


@pytest.mark.parametrize("tree", [None, "{top_k: 4, nodes: 12}"])
def test_eagle_exports_its_heads_folder_to_vllm_and_sglang(tmp_path, tree):
    from test_eagle import SHAPE
    from specpipe.heads.eagle import EagleHead
    from specpipe.heads.io import save_eagle

    save_eagle(EagleHead(SHAPE), tmp_path / "eagle", target="smollm2-135m")
    args = ["model=smollm2-135m", "proposer=eagle", f"proposer.heads={tmp_path / 'eagle'}", "gamma=5",
            *([f"proposer.tree={tree}"] if tree else [])]
    cfg = compose(args)
    v = vllm.export(plan_of(cfg))
    assert v.settings == {"method": "eagle", "model": str((tmp_path / "eagle").resolve()), "num_speculative_tokens": 5}
    assert set(v.settings) <= set(VLLM_0_34_0_SPECULATIVE_CONFIG_KEYS)
    assert any("dynamic tree" in w for w in v.warnings) == bool(tree)
    s = sglang.export(plan_of(cfg)).settings
    assert s["--speculative-algorithm"] == "EAGLE"  # the flags: the wheel judges the eagle cases above
    assert s["--speculative-draft-model-path"] == str((tmp_path / "eagle").resolve())
    expected = (5, 4, 13) if tree else (5, 1, 6)  # steps, top-k, draft tokens (incl. the verified one)
    assert (s["--speculative-num-steps"], s["--speculative-eagle-topk"], s["--speculative-num-draft-tokens"]) == expected
    suffix = vllm.export(plan_of(compose([*args, "proposer.lookup=suffix"])))  # the head alone, said so
    assert suffix.settings == v.settings and any("no suffix decoding beside an EAGLE head" in w for w in suffix.warnings)


def _export(capsys, *args) -> tuple[int, str, str]:
    from specpipe import cli

    code = cli.main(["export", *args])
    printed = capsys.readouterr()
    return code, printed.out, " ".join(printed.err.split())


def test_export_names_the_engine_version_and_keeps_the_previous_one_reachable(tmp_path, capsys):
    draft = ["model=qwen2.5-coder-1.5b", "proposer=draft", "proposer.model=smollm2-135m"]
    code, out, err = _export(capsys, "vllm", *draft, f"out={tmp_path / 'new.json'}")
    assert code == 0 and "exporting for vllm 0.34.0 (for 0.33.0: engine_version=0.33.0)" in err
    assert "--speculative-config" not in out  # the plain target: out= holds its serve command
    assert (tmp_path / "new.json").read_text().strip() == "vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct"
    code, out, err = _export(capsys, "vllm", *draft, "engine_version=0.33.0", f"out={tmp_path / 'old.json'}")
    assert code == 0 and "exporting for vllm 0.33.0" in err
    assert json.loads((tmp_path / "old.json").read_text())["use_heterogeneous_vocab"] is True
    code, out, err = _export(capsys, "sglang", "proposer=ngram", "engine_version=0.5.23")
    assert code == 0 and "exporting for sglang 0.5.23" in err


@pytest.mark.parametrize("args, words", [
    (["vllm", "proposer=ngram", "engine_version=0.32.0"], ["engine_version=0.32.0", "0.34.0 or 0.33.0"]),
    (["sglang", "proposer=ngram", "engine_version=0.5.22"], ["engine_version=0.5.22", "0.5.23"]),
    (["vllm", "proposer=suffix", "proposer.max_cached_tokens=3000000000"],
     ["proposer.max_cached_tokens=3000000000", "suffix_decoding_corpus_tokens", "[0, 2**31)"]),
    (["vllm", "model=qwen2.5-coder-1.5b", "proposer=draft", "proposer.model=smollm2-135m",
      "proposer.fallback_model=smollm2-135m"], ["proposer.fallback_model=smollm2-135m", "tokenizer"]),
])
def test_a_composition_that_cannot_be_exported_says_which_key_and_why_and_writes_nothing(tmp_path, capsys, args, words):
    out = tmp_path / "folder" / "spec.json"
    code, printed, err = _export(capsys, *args, f"out={out}")
    assert code == 2 and printed == "" and "Traceback" not in err
    for word in words:
        assert word in err, err
    assert not (tmp_path / "folder").exists()  # nothing written, not even the folder


def test_the_previous_version_still_exports_what_the_new_one_refuses(tmp_path, capsys):
    code, out, err = _export(capsys, "vllm", "proposer=suffix", "proposer.max_cached_tokens=3000000000",
                             "engine_version=0.33.0", f"out={tmp_path / 'spec.json'}")
    assert code == 0 and json.loads((tmp_path / "spec.json").read_text())["method"] == "suffix"
