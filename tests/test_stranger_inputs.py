"""Hardening, second round: the inputs a new user tries against the newer surfaces.

One test group per class of bad input, each through the mechanism that handles the whole class:
user text escaped before rich reads markup (specpipe/markup.py), sizes bounded
(specpipe/limits.py), heads checked like model files (specpipe/heads/integrity.py), command-line
prompts checked like prompt files (specpipe/prompt_args.py), integers held to int64, `check` and
`export` refusing what `generate` refuses, capped settings reported as used, messages comparing
like with like, `train` keeping earlier heads, and what a batch and an interrupted bench report.
The CLI cases run `specpipe` in a subprocess on tiny models saved to disk.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from specpipe.build import config_checks
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from test_cli import assert_user_error, model_dirs, specpipe  # noqa: F401  (model_dirs: a fixture)


def refused(cfg, *words: str) -> str:
    """The refusals of `check` (no weights) for a config, with every word in one of them."""
    why = " ".join(c.why for c in config_checks(cfg) if c.status == "refuse")
    assert all(word in why for word in words), why
    return why


# 1. Text with square brackets is text, wherever it is printed ---------------------------------


def test_a_bracketed_path_in_an_error_is_printed_as_typed(model_dirs, tmp_path):
    target = f"model={model_dirs / 'target'}"
    assert_user_error(specpipe("generate", target, "prompt_file=[/x]notes.txt"), "prompt_file=[/x]notes.txt")
    folder = tmp_path / "[bold]dir"
    assert_user_error(specpipe("generate", target, f"prompt_file={folder / 'p.txt'}"), "[bold]dir/p.txt")


def test_a_bracketed_prompt_id_and_category_do_not_stop_bench(model_dirs, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": pid, "category": "[red]c", "messages": [
        {"role": "user", "content": "w5 w9 w5 w9 [/b]"}]}) for pid in ("[/b]", "[bold]two")) + "\n")
    result = specpipe("bench", f"model={model_dirs / 'target'}", f"prompts={prompts}", "max_new_tokens=3",
                      "warmup=0", f"out={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr
    assert "[/b] ([red]c)" in result.stderr and "[bold]two" in result.stderr
    assert "[red]c" in result.stdout  # the category in the table
    ids = [p["id"] for p in json.loads((tmp_path / "out" / "results.json").read_text())["prompts"]]
    assert ids == ["[/b]", "[bold]two"]


@pytest.mark.parametrize("pid", ["[/b]", "[bold]two"])
def test_the_worst_prompts_bracketed_id_is_printed_as_typed(pid):
    # which prompt is the worst depends on the timing, so each id is rendered as the worst here
    from rich.console import Console
    from specpipe.bench.table import worst_cell

    for speedup in (0.6, 1.2):
        console = Console(record=True, width=80)
        console.print(worst_cell({"id": pid, "speedup": speedup}))
        assert console.export_text().strip() == f"{speedup:.2f}x {pid}"


def test_check_prints_a_bracketed_path_in_its_table(model_dirs, tmp_path):
    result = specpipe("check", f"model={model_dirs / 'target'}", f"model.lora='{tmp_path / '[/x]adapter'}'")  # quoted: [ opens a list in Hydra's grammar
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "[/x]adapter" in "".join(result.stdout.split())


# 2. Every size has an upper bound, named ------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["controller=cost", "gamma_max=1000000000"], ["gamma_max=1000000000", "64"]),
    (["gamma=100", "gamma_max=100"], ["gamma=100", "64"]),
    (["proposer=eagle", "proposer.heads=/x", "proposer.tree={top_k: 100000, nodes: 16}"], ["top_k=100000", "64"]),
    (["proposer=eagle", "proposer.heads=/x", "proposer.tree={top_k: 4, nodes: 100000}"], ["nodes=100000", "256"]),
    (["proposer=medusa", "proposer.heads=/x", "proposer.tree=[[0],[70000]]"], ["rank 70000"]),
])
def test_gamma_and_tree_sizes_are_bounded_before_anything_is_built(model_dirs, args, words):
    started = time.perf_counter()
    refused(compose([f"model={model_dirs / 'target'}", *args]), *words)
    assert time.perf_counter() - started < 5  # nothing of the asked size was built


def test_slots_are_never_more_than_the_prompts(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", "w5 w9", "w7 w3", "batch=1000", "output=json",
                      "max_new_tokens=2")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["batch"] == 2 and out["config"]["batch"] == 2
    assert "batch=1000 with 2 request(s): 2 decode at once" in " ".join(result.stderr.split())


@pytest.mark.full  # ~16 s of CLI runs
def test_a_memory_estimate_above_the_machine_is_refused_before_loading(model_dirs):
    small = {"SPECPIPE_MEMORY_BYTES": "100000"}  # a machine of 100 kB: the tiny target alone needs more
    for command in (["check"], ["generate"], ["export", "vllm"]):
        result = specpipe(*command, f"model={model_dirs / 'target'}", "proposer=ngram", env=small)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        if command != ["check"]:  # check prints its table, the others one paragraph
            assert "memory" in result.stderr and "this machine has 0.0 GiB" in " ".join(result.stderr.split())
    assert "refuse" in specpipe("check", f"model={model_dirs / 'target'}", "proposer=ngram", env=small).stdout


# 3. Damaged heads are named before anything reads them ----------------------------------------


def _heads(kind: str, folder, target: str):
    from specpipe.heads.io import save_eagle, save_medusa
    from specpipe.heads.medusa import MedusaHeads
    from specpipe.heads.speculators import save_eagle3
    from test_eagle import random_head as eagle_head
    from test_eagle3 import random_head as eagle3_head

    if kind == "medusa":
        save_medusa(MedusaHeads(32, 64, 2), folder, target=target)
    elif kind == "eagle":
        save_eagle(eagle_head(1).float(), folder, target=target)
    else:
        save_eagle3(eagle3_head(1).float(), folder, target=target)
    return folder


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "random": os.urandom(len(data)),
                      "header": data[:8] + b"{garbage" + data[16:]}[how])


@pytest.mark.parametrize("how", ["truncated", "empty", "random", "header"])
@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_damaged_heads_are_refused_by_check_and_load(model_dirs, tmp_path, kind, how):
    from specpipe.heads.io import read_weights

    heads = _heads(kind, tmp_path / kind, str(model_dirs / "target"))
    _damage(heads / "model.safetensors", how)
    cfg = compose([f"model={model_dirs / 'target'}", f"proposer={kind}", f"proposer.heads={heads}"])
    refused(cfg, "damaged", "model.safetensors")
    with pytest.raises(SpecpipeError, match="damaged"):
        read_weights(heads)  # the load path says the same, never a SafetensorError


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_damage(tmp_path):
    """A header that parses and ends inside the file can still point a tensor at the wrong bytes."""
    from specpipe.heads.integrity import heads_problem

    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    assert "needs 16 bytes" in heads_problem(tmp_path)


@pytest.mark.parametrize("command", [["check"], ["export", "vllm"], ["generate"]])
def test_the_cli_refuses_damaged_heads_in_check_export_and_generate(model_dirs, tmp_path, command):
    heads = _heads("eagle", tmp_path / "eagle", str(model_dirs / "target"))
    _damage(heads / "model.safetensors", "truncated")
    result = specpipe(*command, f"model={model_dirs / 'target'}", "proposer=eagle", f"proposer.heads={heads}",
                      f"out={tmp_path / 'spec.json'}" if command[0] == "export" else "max_new_tokens=2")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "damaged" in " ".join((result.stdout + result.stderr).split())
    assert not (tmp_path / "spec.json").exists()  # nothing written for heads that cannot load


# 4 and 5. Command-line prompts: bytes as a file's are checked; a leading `-` is text ----------


def test_a_positional_prompt_that_is_not_utf8_is_refused_before_loading(model_dirs):
    import subprocess
    import sys

    bad = os.fsdecode(b"Say hi \xff there")  # what Python makes of such bytes in argv
    for args in ([bad], [f"prompt={bad}"], ["--", bad]):
        result = subprocess.run([sys.executable, "-m", "specpipe", "generate", f"model={model_dirs / 'target'}", *args],
                                capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        err = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 2 and "Traceback" not in err, err
        assert "not UTF-8" in err and "\\xff" in err and "Loading weights" not in err


def test_a_prompt_starting_with_a_dash_is_a_prompt(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", "-5 is negative, right?", "- w5 w9", "output=json",
                      "baseline=false", "max_new_tokens=2")
    assert result.returncode == 0, result.stderr
    assert [r["prompt"] for r in json.loads(result.stdout)["requests"]] == ["-5 is negative, right?", "- w5 w9"]


def test_an_unknown_flag_is_refused_by_name_and_hydra_flags_still_work(model_dirs):
    assert_user_error(specpipe("generate", f"model={model_dirs / 'target'}", "--verbose"), "--verbose", "after `--`")
    shown = specpipe("generate", f"model={model_dirs / 'target'}", "--cfg", "job")
    assert shown.returncode == 0 and "proposer:" in shown.stdout, shown.stderr


# 6. Integers within their type's range --------------------------------------------------------


@pytest.mark.parametrize("setting", ["seed=1180591620717411303424", "max_new_tokens=99999999999999999999",
                                     "proposer.ngram_max=1180591620717411303424"])
def test_integers_past_int64_are_refused_before_weights(model_dirs, setting, monkeypatch):
    cfg = compose([f"model={model_dirs / 'target'}", setting])
    refused(cfg, setting.partition("=")[0], "64-bit")
    import specpipe.build

    monkeypatch.setattr(specpipe.build, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(SpecpipeError, match="64-bit"):
        Pipeline.from_config(cfg)


def test_the_cli_refuses_a_huge_seed_in_one_paragraph(model_dirs):
    assert_user_error(specpipe("generate", f"model={model_dirs / 'target'}", "seed=1180591620717411303424"),
                      "seed=1180591620717411303424", "64-bit")


# 7. check and export agree with generate --------------------------------------------------------


def test_check_refuses_ngram_min_above_ngram_max(model_dirs):
    refused(compose([f"model={model_dirs / 'target'}", "proposer=ngram", "proposer.ngram_min=5",
                     "proposer.ngram_max=3"]), "ngram_min=5")


def test_check_refuses_a_prompt_that_fills_the_context(model_dirs):
    result = specpipe("check", f"model={model_dirs / 'target'}", " ".join(["w5"] * 300))  # 256 positions
    assert result.returncode == 2 and "no room for output" in " ".join(result.stdout.split()), result.stdout


def test_check_refuses_more_heads_than_the_folder_holds(model_dirs, tmp_path):
    heads = _heads("medusa", tmp_path / "m", str(model_dirs / "target"))
    refused(compose([f"model={model_dirs / 'target'}", "proposer=medusa", f"proposer.heads={heads}",
                     "proposer.num_heads=100"]), "proposer.num_heads=100", "holds 2 heads")


def test_export_with_no_settings_exports_what_generate_runs(tmp_path):
    from specpipe.recipe import load_recipe, shipped_recipe

    result = specpipe("export", "vllm", f"out={tmp_path / 'spec.json'}")  # the default target's shipped recipe
    assert result.returncode == 0, result.stderr
    shipped = load_recipe(shipped_recipe("smollm2-135m")).strategy["proposer"]  # suffix, eagle...: vLLM's names too
    assert json.loads((tmp_path / "spec.json").read_text())["method"] == shipped


# 8. Settings capped or ignored are refused or reported as used -------------------------------------


def test_concurrency_without_requests_is_refused(model_dirs):
    refused(compose([f"model={model_dirs / 'target'}", "concurrency=8"], "bench"), "concurrency=8", "requests=N")


def test_a_cache_len_past_the_model_is_reported_as_allocated(model_dirs):
    checks = config_checks(compose([f"model={model_dirs / 'target'}", "cache_len=100000"]))
    engine = next(c for c in checks if c.name == "engine")
    assert "256 slots" in engine.why and "cache_len=100000" in engine.why


# 9. Messages compare like with like, and name what the user typed --------------------------------


def test_a_heads_config_with_a_string_size_is_named_as_such(model_dirs, tmp_path):
    heads = _heads("medusa", tmp_path / "m", str(model_dirs / "target"))
    config = json.loads((heads / "config.json").read_text())
    (heads / "config.json").write_text(json.dumps({**config, "hidden_size": "32"}))
    why = refused(compose([f"model={model_dirs / 'target'}", "proposer=medusa", f"proposer.heads={heads}"]),
                  "hidden_size='32'", "not an integer")
    assert "32 vs the target's 32" not in why


def test_a_proposer_option_tunes_the_shipped_recipe_and_errors_name_what_was_typed():
    from specpipe.config import conf_dir, with_shipped_recipe

    applied = with_shipped_recipe(["proposer.max_depth=12"], "generate", conf_dir())  # the recipe's suffix proposer
    assert applied[0].startswith("recipe=") and compose(applied).proposer.max_depth == 12
    with pytest.raises(SpecpipeError) as err:
        compose(with_shipped_recipe(["proposer.bogus=1"], "generate", conf_dir()))
    assert "proposer.bogus=1" in str(err.value)
    assert "proposer=suffix" not in str(err.value)  # the recipe's expanded settings are not the user's


def test_compose_with_no_proposer_applies_the_shipped_recipe_as_the_commands_do(monkeypatch):
    """One rule for the library and every command: `compose([])` is what `specpipe generate` runs."""
    from specpipe import cli
    from specpipe.recipe import load_recipe, shipped_recipe

    shipped = shipped_recipe("smollm2-135m")
    strategy = load_recipe(shipped).strategy
    for command in ("generate", "check", "bench"):
        cfg = compose([], command)
        assert cfg.recipe == str(shipped) and cfg.gamma == strategy["gamma"], command
        assert strategy["proposer"] in cfg.proposer._target_, command  # suffix, not conf/'s default ngram
        ran = {}
        monkeypatch.setattr(cli, "_hydra_commands", lambda: {command: lambda c, **k: ran.update(cfg=c) or 0})
        assert cli.main([command]) == 0
        assert ran["cfg"] == cfg, command  # the CLI's config is the library's, key for key
    assert compose(["gamma=3"]).gamma == 3 and compose(["gamma=3"]).recipe == str(shipped)  # a setting still wins
    assert compose(["proposer=ngram"]).recipe == "" and "ngram" in compose(["proposer=ngram"]).proposer._target_
    assert compose([], "tune").recipe == "" and compose([], "train").get("recipe") is None  # tune and train: their own


# 10. train keeps heads it did not write -----------------------------------------------------------


def test_train_refuses_to_replace_earlier_heads(tmp_path, monkeypatch):
    from specpipe.commands import train

    folder = tmp_path / "recipes" / "target"
    (folder / "medusa").mkdir(parents=True)
    (folder / "medusa" / "config.json").write_text("{}")
    monkeypatch.setattr(train, "resolve", lambda *a, **k: pytest.fail("the model was resolved"))
    cfg = compose(["model=/some/target", "proposer=medusa", f"out={tmp_path / 'recipes'}"], "train")
    with pytest.raises(SpecpipeError, match="overwrite=true"):
        train.run(cfg)
    assert (folder / "medusa" / "config.json").read_text() == "{}"
    with pytest.raises(pytest.fail.Exception, match="resolved"):  # with overwrite=true it goes on
        train.run(compose(["model=/some/target", "proposer=medusa", f"out={tmp_path / 'recipes'}", "overwrite=true"],
                          "train"))


# 11. What a batch and an interrupted bench report ---------------------------------------------------


def test_a_batch_reports_greedy_equal_and_baseline_ids_per_request(model_dirs):
    result = specpipe("generate", f"model={model_dirs / 'target'}", "w5 w9 w5 w9", "w7 w3", "output=json",
                      "max_new_tokens=4")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for request in out["requests"]:
        assert request["greedy_equal"] is (request["token_ids"] == request["baseline_token_ids"])
    assert out["greedy_equal"] is all(r["greedy_equal"] for r in out["requests"])


def test_an_interrupted_bench_keeps_its_prompts_and_resumes(model_dirs, tmp_path, monkeypatch):
    from specpipe.bench import runner
    from specpipe.commands import bench

    out = tmp_path / "out"
    cfg = compose([f"model={model_dirs / 'target'}", "prompts=dev", "limit=1", "categories=[code,chat,math]",
                   "max_new_tokens=2", "warmup=0", f"out={out}"], "bench")
    real, calls = runner._compare, []

    def dies_on_the_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(runner, "_compare", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        bench.run(cfg)
    kept = json.loads((out / "results.partial.json").read_text())
    assert len(kept["prompts"]) == 2 and not (out / "results.json").exists()
    calls.clear()
    monkeypatch.setattr(runner, "_compare", lambda *args: calls.append(1) or real(*args))
    assert bench.run(cfg) == 0
    assert len(calls) == 1  # only the prompt left was measured
    results = json.loads((out / "results.json").read_text())
    assert len(results["prompts"]) == 3 and not (out / "results.partial.json").exists()


# 12. Messages name the one real cause, and a fix that helps with it --------------------------------


def test_device_cuda_without_a_gpu_names_that_alone_and_a_fix_that_helps(model_dirs):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: nothing to refuse")
    checks = config_checks(compose([f"model={model_dirs / 'target'}", "proposer=ngram", "device=cuda"]))
    device = next(c for c in checks if c.name == "device")
    assert device.status == "refuse" and ("built without CUDA" in device.why or "sees no CUDA GPU" in device.why)
    assert "device=cpu" in device.fix and "quantize" not in device.why + device.fix  # a precision cannot bring a GPU
    result = specpipe("generate", f"model={model_dirs / 'target'}", "proposer=ngram", "device=cuda")
    assert_user_error(result, "device=cuda", "device=cpu")
    assert "Loading weights" not in result.stderr


def test_without_llama_cpp_check_still_shows_the_refusals_that_do_not_need_it(monkeypatch):
    import sys

    from specpipe.checks.llamacpp import check_llamacpp
    from specpipe.settings import resolve

    def checked(settings):
        cfg = compose(settings)
        return check_llamacpp(cfg, resolve(cfg, fetch=False))

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` fails, as where it is not installed
    checks = checked(["engine=llamacpp", "proposer=eagle3", "proposer.heads=/x", "graphs=on", "model.quantize=fp16"])
    refused = [c for c in checks if c.status == "refuse"]
    assert "specpipe install llamacpp" in refused[0].fix
    whys = " ".join(c.why for c in refused[1:])
    assert "graphs=on" in whys and "model.quantize=fp16" in whys and "proposer=eagle3" in whys
    fine = checked(["engine=llamacpp", "proposer=ngram"])
    assert [c.name for c in fine if c.status == "refuse"] == ["engine"]  # the library alone


@pytest.mark.parametrize("sweep", [False, True])
def test_peer_llama_cpp_without_the_library_is_refused_before_weights_load(model_dirs, tmp_path, monkeypatch,
                                                                           capsys, sweep):
    import sys

    from specpipe import cli

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(Pipeline, "from_config", classmethod(lambda *a, **k: pytest.fail("weights loaded")))
    out = tmp_path / "out"
    args = [f"model={model_dirs / 'target'}", "proposer=ngram", "peer=llama-cpp", f"out={out}"]
    assert cli.main(["bench", *(["-m", "gamma=2,3"] if sweep else []), *args]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "peer=llama-cpp" in said and "`specpipe install llamacpp`" in said and "Traceback" not in said
    assert not out.exists()  # nothing written, the sweep's folder included


def test_an_artifact_that_links_out_of_its_recipe_is_named_as_a_link(tmp_path):
    from specpipe.recipe import load_recipe

    folder, elsewhere = tmp_path / "recipe", tmp_path / "elsewhere"
    (folder / "heads").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"x")
    (folder / "heads" / "config.json").write_text("{}")
    (folder / "heads" / "model.safetensors").symlink_to(elsewhere / "model.safetensors")
    (folder / "specpipe.yaml").write_text("specpipe_recipe: 1\ntarget: smollm2-135m\nartifacts: {heads: heads}\n"
                                          "strategy: {proposer: medusa, proposer.heads: 'artifact:heads'}\n")
    with pytest.raises(SpecpipeError) as err:  # a file of the artifact folder, not only the folder, is checked
        load_recipe(folder)
    said = str(err.value)
    assert "heads/model.safetensors, a symbolic link to" in said and str(elsewhere) in said and "cp -rL" in said
    (folder / "gone").symlink_to(folder / "nowhere")
    (folder / "specpipe.yaml").write_text("specpipe_recipe: 1\ntarget: smollm2-135m\nartifacts: {heads: gone}\n"
                                          "strategy: {proposer: medusa, proposer.heads: 'artifact:heads'}\n")
    with pytest.raises(SpecpipeError, match="is a symbolic link to .*nowhere, which does not exist"):
        load_recipe(folder)


@pytest.mark.parametrize("args, words, not_said", [
    (["plot=maybe"], ["plot=maybe is not true or false"], "is not a folder"),
    (["plot=true"], ["names no folder", "specpipe report sweeps/smollm plot=true"], "plot=true is not a folder"),
    (["sweeps", "markdown=maybe"], ["markdown=maybe is not true or false"], "plot="),
])
def test_report_names_the_setting_that_is_wrong(args, words, not_said, capsys):
    from specpipe import cli

    assert cli.main(["report", *args]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert all(word in said for word in words) and not_said not in said.partition("usage:")[0], said


@pytest.mark.parametrize("gammas, words", [
    ("gammas=[0]", ["gammas=[0] holds γ=0", "at least 1"]),
    ("gammas=[2,10]", ["gammas=[2, 10] holds γ=10", "gamma_max=8", "gamma_max=10"]),
    ("gammas=[2,100] gamma_max=100", ["gammas=[2, 100]", "γ=100 is more than 64"]),
    ("gammas=4", ["gammas=4", "gammas=[2,4,6]"]),
])
def test_gammas_errors_speak_of_gammas(model_dirs, gammas, words, tmp_path):
    result = specpipe("tune", f"model={model_dirs / 'target'}", *gammas.split(), f"out={tmp_path / 'r'}",
                      f"work={tmp_path / 'w'}")
    assert_user_error(result, *words)
    message = result.stderr.partition("Settings are")[0]
    assert "gamma=" not in message.replace("gamma_max=", "") and "skipped" not in result.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


# 13. tune, like train, never replaces a recipe silently ---------------------------------------------


def test_tune_refuses_to_replace_a_recipe_without_overwrite(model_dirs, tmp_path):
    folder = tmp_path / "recipes" / "target"
    folder.mkdir(parents=True)
    shipped = "specpipe_recipe: 1\ntarget: target\nstrategy: {proposer: suffix, gamma: 3}\n"
    (folder / "specpipe.yaml").write_text(shipped)
    result = specpipe("tune", f"model={model_dirs / 'target'}", f"out={tmp_path / 'recipes'}",
                      f"work={tmp_path / 'work'}", "strategies=[ngram]", "gammas=[2]", "report_on=none")
    assert_user_error(result, f"{folder / 'specpipe.yaml'} exists already", "overwrite=true", "out=")
    assert "error:" in result.stderr and result.stderr.count("\nerror:") + result.stderr.startswith("error:") == 1
    assert [p.name for p in folder.iterdir()] == ["specpipe.yaml"] and (folder / "specpipe.yaml").read_text() == shipped
    assert not (tmp_path / "work").exists()  # nothing measured
