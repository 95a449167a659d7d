"""What is on disk, trusted no further than it is checked: a dense cache copy damaged inside its
size, an earlier run's measurements and recipes (never lost silently: outputs.keep_aside and
outputs.refuse_replacing), and a recipe's `measured` block (one schema, measured.MEASURED).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from specpipe.commands import models as models_command
from specpipe.commands import tune
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.models import integrity, loader
from specpipe.outputs import KEPT_ASIDE, keep_aside
from specpipe.recipe import load_recipe
from test_bench import setup  # noqa: F401  (the tiny models and prompt set)
from test_cli import assert_user_error, specpipe
from test_model_files import cache, tiny_gguf, tinyzoo  # noqa: F401  (fixtures)
from test_tune import results

# ---- a dense copy damaged inside its size -------------------------------------------------------


def _zero(path, start: int, count: int) -> None:
    """`count` bytes from `start` zeroed in place: the size, and so the manifest's record, unchanged."""
    data = bytearray(path.read_bytes())
    data[start:start + count] = bytes(count)
    path.write_bytes(bytes(data))


HEADER_DAMAGE = {
    "length zeroed": lambda p: _zero(p, 0, 8),
    "JSON zeroed": lambda p: _zero(p, 20, 16),
    "an offset changed": lambda p: p.write_bytes(p.read_bytes().replace(b'"data_offsets":[0,', b'"data_offsets":[1,', 1)),
}


@pytest.mark.parametrize("case", HEADER_DAMAGE)
def test_a_dense_copy_damaged_inside_its_size_is_listed_named_and_rebuilt(case, tinyzoo, cache, capfd,  # noqa: F811
                                                                          monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    first = loader.load("tinyzoo")
    dense = first.source.dense
    with torch.no_grad():
        expected = first.model(torch.tensor([[5, 17, 33]])).logits
    del first  # its weights are mapped from the file spoiled next
    weights = dense / "model.safetensors"
    size = weights.stat().st_size
    HEADER_DAMAGE[case](weights)
    assert weights.stat().st_size == size and "header" in integrity.folder_problem(dense)
    models_command.run([])  # `specpipe models` says what it verified
    line = next(ln for ln in capfd.readouterr().out.splitlines() if "tinyzoo" in ln)
    assert "damaged" in line and "model.safetensors" in line and "corrupt header" in line and "rebuilt" in line
    capfd.readouterr()
    again = loader.load("tinyzoo")  # named, then rebuilt from the GGUF
    assert "is damaged" in " ".join(capfd.readouterr().err.split())
    assert integrity.folder_problem(dense) is None
    with torch.no_grad():
        assert torch.equal(again.model(torch.tensor([[5, 17, 33]])).logits, expected)


# ---- earlier measurements and recipes are never lost silently ---------------------------------------


def test_keep_aside_dates_a_file_and_never_overwrites_another(tmp_path):
    first = tmp_path / "results.partial.json"
    kept = []
    for text in ("one", "two"):
        first.write_text(text)
        os.utime(first, (1_700_000_000, 1_700_000_000))  # the same second: the second copy is numbered
        kept.append(keep_aside(first))
    assert [p.read_text() for p in kept] == ["one", "two"] and not first.exists()
    assert kept[0].name.startswith("results.partial-") and kept[0].suffix == ".json"
    assert all(KEPT_ASIDE.search(p.name) for p in kept) and kept[1].stem.endswith("-1")


def test_bench_keeps_an_interrupted_runs_partial_results_measured_otherwise(setup, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    settings = compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "limit=1", "warmup=0",
                        "max_new_tokens=99"], "bench")
    from specpipe.bench.results import measured_with
    from specpipe.commands.bench import select_prompts

    earlier = {"measured_with": measured_with(settings, select_prompts(settings)), "prompts": {"0": {"id": "x"}}}
    (out / "results.partial.json").write_text(json.dumps(earlier))
    result = specpipe("bench", f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "limit=1",
                      "max_new_tokens=3", "warmup=0", f"out={out}")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "results.partial.json here was measured otherwise (max_new_tokens: 99 → 3)" in said and "kept as" in said
    kept = [p for p in out.iterdir() if p.name.startswith("results.partial-")]
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == earlier
    assert (out / "results.json").is_file() and not (out / "results.partial.json").exists()


def _stub_tune(monkeypatch, setup, tmp_path, *extra):  # noqa: F811
    monkeypatch.setattr(tune, "_bench_candidate", lambda cfg, name, *a, **k: results(1.5 if "g4" in name else 1.2))
    return compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "report_on=none",
                    "strategies=[ngram]", "gammas=[2,4]", f"out={tmp_path / 'recipes'}", f"work={tmp_path / 'w'}",
                    *extra], "tune")


def test_tune_refuses_to_replace_a_recipe_unless_told_to_overwrite(setup, tmp_path, monkeypatch, capsys):  # noqa: F811
    folder = tmp_path / "recipes" / "target"
    folder.mkdir(parents=True)
    shipped = "specpipe_recipe: 1\ntarget: target\nstrategy: {proposer: suffix, gamma: 3}\n"
    (folder / "specpipe.yaml").write_text(shipped)
    with pytest.raises(SpecpipeError, match="exists already.*overwrite=true"):
        tune.run(_stub_tune(monkeypatch, setup, tmp_path))  # as train does: before anything is measured
    assert [p.name for p in folder.iterdir()] == ["specpipe.yaml"] and (folder / "specpipe.yaml").read_text() == shipped
    (folder / "specpipe-20261207-101500.yaml").write_text(shipped)  # an earlier tune's dated copy
    assert tune.run(_stub_tune(monkeypatch, setup, tmp_path, "overwrite=true")) == 0
    assert load_recipe(folder).measured["winner"] == "ngram-g4"  # replaced, as asked
    assert "skipped (not a usable recipe" not in capsys.readouterr().err  # the dated copy is no candidate


def test_train_refuses_to_replace_heads_without_overwrite(tmp_path):
    from specpipe.commands import train

    (tmp_path / "recipes" / "target" / "medusa").mkdir(parents=True)
    with pytest.raises(SpecpipeError, match="exists already.*overwrite=true"):
        train.run(compose(["model=/some/target", "proposer=medusa", f"out={tmp_path / 'recipes'}"], "train"))


# ---- a recipe's measured block: one schema ---------------------------------------------------------

BAD_MEASURED = {
    "features a number": ({"tuned_on": {"device": "cpu", "cpu_features": 5}}, "measured.tuned_on.cpu_features",
                          "a list of strings"),
    "features a string": ({"tuned_on": {"device": "cpu", "cpu_features": "avx512"}},
                          "measured.tuned_on.cpu_features", "'avx512'"),
    "device a list": ({"tuned_on": {"device": ["cuda"]}}, "measured.tuned_on.device", "a string"),
    "tuned_on a string": ({"tuned_on": "cpu"}, "measured.tuned_on", "a mapping"),
    "gamma_mean a string": ({"gamma_mean": "four"}, "measured.gamma_mean", "a number or null"),
    "gamma_mean a boolean": ({"gamma_mean": True}, "measured.gamma_mean", "a number or null"),
    "a category's speedup a list": ({"speedup_by_category": {"code": [1.2]}}, "measured.speedup_by_category.code",
                                    "a number"),
}


@pytest.mark.parametrize("case", BAD_MEASURED)
def test_a_malformed_measured_block_is_refused_by_name_in_check_generate_and_export(setup, tmp_path, case):  # noqa: F811
    measured, name, kind = BAD_MEASURED[case]
    folder = tmp_path / "recipe"
    folder.mkdir()
    (folder / "specpipe.yaml").write_text(yaml.safe_dump({
        "specpipe_recipe": 1, "target": "smollm2-135m", "strategy": {"proposer": "ngram", "controller": "cost"},
        "measured": {"winner": "ngram", "free-form note": [1, "two"], **measured}}))
    with pytest.raises(SpecpipeError, match=name.replace(".", r"\.")):
        load_recipe(folder)
    model = f"model={setup / 'target'}"
    for args in (["check", f"recipe={folder}", model], ["generate", "w5 w9", f"recipe={folder}", model],
                 ["export", "vllm", f"recipe={folder}", model, f"out={tmp_path / 'x.json'}"]):
        assert_user_error(specpipe(*args), name, kind, "Fix that entry or delete it")
    assert not (tmp_path / "x.json").exists()


def test_free_form_measured_keys_and_every_shipped_recipe_still_load():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*/*.yaml")):
        load_recipe(path)


def test_a_refused_command_leaves_no_empty_out_folder(setup, tmp_path):  # noqa: F811
    out = tmp_path / "new" / "out"
    result = specpipe("bench", f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "limit=1",
                      "proposer=eagle", f"proposer.heads={tmp_path / 'no-heads'}", f"out={out}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("x")  # a folder that was there, or holds anything, stays
    result = specpipe("bench", f"model={setup / 'target'}", "proposer=eagle", f"proposer.heads={tmp_path / 'no'}",
                      f"out={tmp_path / 'kept'}")
    assert result.returncode == 2 and (tmp_path / "kept" / "mine.txt").is_file()
