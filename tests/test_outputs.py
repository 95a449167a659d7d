"""No measurement is ever lost: outputs checked before the work, kept elsewhere when a write fails
after it, and an earlier job's results reused only if measured with the same settings."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

import pytest

from specpipe import cli
from specpipe.bench.results import SCHEMA, SUMMARY_KEYS, earlier_results, measured_with, read_results, write_json
from specpipe.commands import bench, train, tune
from specpipe.config import compose, conf_dir
from specpipe.errors import SpecpipeError
from specpipe.outputs import atomic_write, save_or_keep
from specpipe.recipe import load_recipe
from test_bench import setup  # noqa: F401  (the tiny models and prompt set)
from test_cli import assert_user_error, specpipe

ROOT = os.geteuid() == 0  # root writes into a 0o555 folder: those cases need a regular user


def quick(setup, *extra: str) -> list[str]:  # noqa: F811
    return [f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "limit=1", "max_new_tokens=6",
            "warmup=0", *extra]


def clobber(folder) -> None:
    """The destination goes bad after the preflight: a file where the folder was (fails for root too)."""
    shutil.rmtree(folder)
    folder.write_text("")


def then_clobber(work, folder):
    """`work`, after which `folder` goes bad: the failure comes after the work, not at the preflight."""
    def wrapped(*args, **kwargs):
        result = work(*args, **kwargs)
        clobber(folder)
        return result
    return wrapped


def strays(root) -> list:
    return list(root.rglob(".specpipe-*"))


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps messages at the terminal's width: paths stay whole


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def message(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command, setting, words", [
    ("bench", "out={file}", "is a file, not a folder"),
    ("bench", "out={file}/sub", "is a file, not a folder"),
    ("bench", "out={ro}", "Permission denied"),
    ("tune", "out={file}", "is a file, not a folder"),
    ("tune", "work={file}/deeper", "is a file, not a folder"),
    ("tune", "out={folder_with_recipe_dir}", "is a folder, where specpipe writes a file"),
    ("train", "out={file}/sub", "is a file, not a folder"),
    ("export", "out={folder}", "is a folder, where specpipe writes a file"),
    ("export", "out={file}/speculative_config.json", "is a file, not a folder"),
])
def test_an_unwritable_output_is_refused_before_any_work(setup, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                         command, setting, words):
    if "{ro}" in setting and ROOT:
        pytest.skip("root writes into a read-only folder")
    (tmp_path / "file").write_text("")
    (tmp_path / "ro").mkdir(mode=0o555)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder_with_recipe_dir" / "target" / "specpipe.yaml").mkdir(parents=True)
    monkeypatch.setattr("specpipe.pipeline.Pipeline.from_config", lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(train, "resolve", lambda *a: pytest.fail("training started"))
    setting = setting.format(**{name: tmp_path / name for name in ("file", "ro", "folder", "folder_with_recipe_dir")})
    args = {"export": ["vllm", f"model={setup / 'target'}", "proposer=ngram", setting],
            "train": [f"model={setup / 'target'}", "proposer=medusa", setting]}.get(command, quick(setup, setting))
    assert cli.main([command, *args]) == 2
    said = message(capsys)
    assert words in said and "Nothing was run" in said and said.count("error:") == 1, said
    assert not strays(tmp_path)


def test_the_cli_refuses_an_unwritable_out_in_one_paragraph(setup, tmp_path):  # noqa: F811
    (tmp_path / "file").write_text("")
    result = specpipe("bench", *quick(setup, f"out={tmp_path / 'file' / 'sub'}"))
    assert_user_error(result, "is a file, not a folder", "Nothing was run")
    assert "\n\n" not in result.stderr.strip()


def test_a_sweep_into_a_file_is_refused_before_hydra_makes_its_folder(setup, tmp_path):  # noqa: F811
    assert "specpipe.outputs.SweepPreflight" in (conf_dir() / "bench.yaml").read_text()  # the callback that refuses
    (tmp_path / "file").write_text("")
    result = specpipe("bench", "-m", "gamma=2,3", *quick(setup, f"out={tmp_path / 'file'}"))
    assert_user_error(result, "is a file, not a folder", "Nothing was run")


def test_bench_creates_a_deep_out_and_keeps_results_it_could_not_write(setup, tmp_path, cache, capsys,  # noqa: F811
                                                                       monkeypatch):
    out = tmp_path / "a" / "b" / "c"
    monkeypatch.setattr(bench, "measure", then_clobber(bench.measure, out))  # clobber: it existed, made by the preflight
    assert cli.main(["bench", *quick(setup, f"out={out}")]) == 2
    said = message(capsys)
    kept = next(cache.glob("unsaved/*/results.json"))
    assert f"Kept instead at {kept}, so nothing is lost" in said and "Traceback" not in said
    assert len(read_results(kept)["prompts"]) == 2  # the measurement itself, whole
    assert not strays(tmp_path)


def test_a_failed_write_leaves_no_temporary_file_and_the_fallback_is_named(tmp_path, cache, monkeypatch):
    def fills_the_disk(f):
        f.write("{half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(tmp_path / "out" / "results.json", fills_the_disk)
    assert list((tmp_path / "out").iterdir()) == []

    def write(path):
        return atomic_write(path, fills_the_disk if "cache" not in str(path) else lambda f: f.write("{}"))

    with pytest.raises(SpecpipeError, match="No space left on device.*Kept instead at .*cache/unsaved/.*/results.json"):
        save_or_keep(write, tmp_path / "out" / "results.json", "the results")
    (tmp_path / "blocked").write_text("")  # and if no fallback takes it either, the error says where it tried
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "blocked" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "blocked"))
    with pytest.raises(SpecpipeError, match="nor to .*blocked is a file, not a folder"):
        save_or_keep(write, tmp_path / "out" / "results.json", "the results")
    assert not strays(tmp_path)


def fake_results(cfg, prompts, legacy: bool = False) -> dict:
    """A results.json as bench writes it; `legacy`: from before `measured_with` (its config only)."""
    payload = {"schema": SCHEMA, "created": "", "model": "", "strategy": {}, "environment": {}, "prompts": [],
               "config": {**measured_with(cfg, prompts)["settings"], "out": "x"},
               "summary": {"overall": {k: None for k in SUMMARY_KEYS}}}
    return payload if legacy else {**payload, "measured_with": measured_with(cfg, prompts)}


CHANGES = {  # a rerun's settings: what must be said to differ (None: the same measurement)
    "out=elsewhere plot=true": None,  # where results go is not what they measure
    "max_new_tokens=7": "max_new_tokens: 6 → 7", "limit=2": "limit: 1 → 2",
    "categories=[edit]": "categories: [] → ['edit']", "model.quantize=int8": "model.quantize: none → int8",
    "engine=hf": "engine: auto → hf", "temperature=0.5": "temperature: 0.0 → 0.5", "gamma=7": "gamma: 4 → 7",
    "warmup=1": "warmup: 0 → 1", "prompts={other}": "prompts: ", "proposer=twin": "proposer._target_: ",
}


def test_earlier_results_are_reused_only_with_the_same_settings(setup, tmp_path):  # noqa: F811
    for name in ("mine", "other"):
        shutil.copy(setup / "prompts.jsonl", tmp_path / f"{name}.jsonl")
    base = quick(setup, f"prompts={tmp_path / 'mine.jsonl'}")
    cfg = compose(base, "bench")
    for legacy in (False, True):
        write_json(tmp_path / f"{legacy}.json", fake_results(cfg, bench.select_prompts(cfg), legacy))

    def compare(*change: str) -> dict:
        now = compose([*base, *(c.format(other=tmp_path / "other.jsonl") for c in change)], "bench")
        measured = measured_with(now, bench.select_prompts(now))
        return {legacy: earlier_results(tmp_path / f"{legacy}.json", measured) for legacy in (False, True)}

    for change, differs in CHANGES.items():
        for legacy, (earlier, changed) in compare(*change.split()).items():
            assert (earlier is None) == (differs is not None), (change, legacy, changed)
            assert differs is None or any(differs in c for c in changed), (change, changed)
    (tmp_path / "mine.jsonl").write_text((setup / "prompts.jsonl").read_text().replace("w2 ", "w3 "))
    edited = compare()  # same settings, same path: the file was edited since
    assert edited[False] == (None, [f"the text of prompts={tmp_path / 'mine.jsonl'} (edited since)"])
    assert edited[True][0] is not None  # a file from before fingerprints knows no prompt text: reused


def test_a_sweep_rerun_with_other_settings_measures_again_and_says_so(setup, tmp_path, capsys):  # noqa: F811
    job = tmp_path / "sweep" / "gamma=2,max_new_tokens=6,model=target"  # the folder of the sweep's one job
    assert cli.main(["bench", *quick(setup, "gamma=2", f"out='{job}'")]) == 0  # an earlier job, with limit=1
    again = specpipe("bench", "-m", "gamma=2", *quick(setup, f"out={tmp_path / 'sweep'}", "limit=2"))
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert "measured in an earlier run with other settings (limit: 1 → 2)" in said and "skipped" not in said
    assert [p.name for p in (tmp_path / "sweep").glob("gamma=*")] == [job.name]
    assert len(read_results(job / "results.json")["prompts"]) == 3  # both categories' prompts, measured anew
    assert len(list(job.glob("results-*.json"))) == 1  # the earlier job's results, kept


def test_tune_reuses_only_same_settings_and_keeps_a_recipe_it_could_not_write(  # noqa: F811
        setup, tmp_path, cache, capsys, monkeypatch):
    out = tmp_path / "recipes"

    def run(*extra):
        cfg = compose(quick(setup, "strategies=[ngram]", "gammas=[2]", "report_on=none", f"out={out}",
                            f"work={tmp_path / 'work'}", "overwrite=true", *extra), "tune")
        tune.run(cfg)
        return message(capsys)

    assert "ngram-g2: measured in an earlier run" not in run()
    results = tmp_path / "work" / "target" / "ngram-g2" / "results.json"
    first = results.stat().st_mtime_ns
    assert "ngram-g2: measured in an earlier run with the same settings" in run()
    assert results.stat().st_mtime_ns == first
    said = run("max_new_tokens=5")
    assert "other settings (max_new_tokens: 6 → 5): measuring again" in said
    assert len(list(results.parent.glob("results-*.json"))) == 1

    monkeypatch.setattr(tune, "recipe_data", then_clobber(tune.recipe_data, out / "target"))
    with pytest.raises(SpecpipeError, match="Kept instead at") as refused:
        run("max_new_tokens=5")  # reuses the candidate just measured: only the recipe is written
    kept = next(cache.glob("unsaved/*/specpipe.yaml"))
    assert str(kept) in str(refused.value) and load_recipe(kept).target == str(setup / "target")
    assert not strays(tmp_path)


def test_export_and_train_keep_what_they_could_not_write(setup, tmp_path, cache, capsys, monkeypatch):  # noqa: F811
    from specpipe.commands import export

    # the export is made before the preflight (a refused one writes nothing): the folder goes bad right after it
    monkeypatch.setattr(export, "writable_output", then_clobber(export.writable_output, tmp_path / "exp"))
    assert cli.main(["export", "vllm", f"model={setup / 'target'}", "proposer=ngram",
                     f"out={tmp_path / 'exp' / 'config.json'}"]) == 2
    assert f"Kept instead at {next(cache.glob('unsaved/*/config.json'))}" in message(capsys)

    monkeypatch.setattr(train, "_epochs", then_clobber(train._epochs, tmp_path / "trained" / "target"))
    (tmp_path / "corpus.txt").write_text(" ".join(f"w{i % 60 + 2}" for i in range(600)))
    cfg = compose([f"model={setup / 'target'}", "proposer=medusa", "num_heads=2", "tokens=256", "seq_len=32",
                   "epochs=1", "batch=32", "vocab_subset=64", f"sources=[{tmp_path / 'corpus.txt'}]",
                   f"out={tmp_path / 'trained'}"], "train")
    with pytest.raises(SpecpipeError, match="Kept instead at"):
        train.run(cfg)
    kept = next(cache.glob("unsaved/*/target/medusa.yaml"))
    assert load_recipe(kept).measured["held_out_top1_per_head"] and (kept.parent / "medusa" / "config.json").is_file()
    assert not strays(tmp_path)
