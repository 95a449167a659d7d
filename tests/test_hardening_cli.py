"""The command line's remaining classes of failure, each through its one mechanism:
check and generate count a prompt by one function before any weights load; a `-m` sweep's jobs
are checked as single runs are (cli.check_sweep); messages name the setting typed and only what
is wrong; settings are never silently ignored; no width cuts a table (ui/tables.py).
"""

from __future__ import annotations

import io
import json
import shutil

import pytest
import yaml
from rich.console import Console
from rich.table import Table

from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.ui.tables import show
from test_bench import setup  # noqa: F401  (the tiny models and prompt set)
from test_cli import assert_user_error, model_dirs, specpipe  # noqa: F401  (model_dirs: a fixture)

# ---- check and generate count a prompt the same way ---------------------------------------------


@pytest.fixture(scope="module")
def chat_target(model_dirs, tmp_path_factory):  # noqa: F811
    """The tiny target with a chat template that adds five tokens to every prompt."""
    folder = tmp_path_factory.mktemp("chat") / "target"
    shutil.copytree(model_dirs / "target", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}w1 w1 w1 w1 w1 {{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_prompt_the_chat_template_overfills_is_refused_by_check_and_by_generate_before_loading(chat_target):
    prompt = " ".join(f"w{i + 2}" for i in range(12))  # fits 16 tokens alone, not with the template's 5
    for command in ("check", "generate"):  # check says it in its table, generate as its error
        result = specpipe(command, prompt, f"model={chat_target}", "cache_len=16", "max_new_tokens=2")
        said = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 2 and "Traceback" not in result.stderr, said
        assert all(w in said for w in ("tokens after the chat template)", "no room for output", "16-token")), said
        assert "Loading weights" not in result.stderr
    fits = specpipe("generate", prompt, f"model={chat_target}", "cache_len=16", "model.chat=false",
                    "max_new_tokens=2", "output=json", "baseline=false")
    assert fits.returncode == 0, fits.stderr


# ---- a sweep's jobs are checked before Hydra writes anything -----------------------------------------


@pytest.mark.parametrize("sweep, words", [
    (["gamma=2,x"], ["job 2 of 2", "gamma=x", "could not be converted"]),
    (["gamma=range(1,x)"], ["cannot be read", "range(START,STOP"]),
    (["limit=1,-1"], ["job 2 of 2", "limit=-1 must be at least 0"]),
    (["proposer=ngram,nothing"], ["job 2 of 2", "nothing"]),
])
def test_a_bad_value_in_a_sweep_is_one_paragraph_and_nothing_is_written(setup, tmp_path, sweep, words):  # noqa: F811
    out = tmp_path / "sweep"
    result = specpipe("bench", "-m", *sweep, f"model={setup / 'target'}", f"out={out}")
    assert_user_error(result, *words, "Nothing")
    assert not out.exists() and not list(tmp_path.rglob("multirun.yaml"))


def test_cfg_job_shows_the_prompt_that_would_run(model_dirs):  # noqa: F811
    result = specpipe("generate", "Hi, x=1 ${oc.env:HOME}", "--cfg", "job", f"model={model_dirs / 'target'}")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["prompt"] == "Hi, x=1 ${oc.env:HOME}"


# ---- messages name what was typed, and only what is wrong -------------------------------------------


def test_report_names_a_value_that_is_not_true_or_false(tmp_path):
    assert_user_error(specpipe("report", str(tmp_path), "plot=maybe"), "plot=maybe is not true or false",
                      "plot=true")
    assert_user_error(specpipe("report", str(tmp_path), "plots=true"), "`plots=true` is not a report setting")


def test_train_names_only_the_settings_out_of_range():
    from specpipe.commands import train

    with pytest.raises(SpecpipeError) as err:
        train._validate(compose(["model=/x", "proposer=medusa", "epochs=0"], "train"))
    assert "epochs=0 must be at least 1" in str(err.value)
    assert "held_out" not in str(err.value) and "lr=" not in str(err.value) and "none below" not in str(err.value)


def test_gammas_errors_speak_of_gammas(setup, tmp_path):  # noqa: F811
    result = specpipe("tune", f"model={setup / 'target'}", "gammas=[2,1000]", f"out={tmp_path / 'r'}",
                      f"work={tmp_path / 'w'}")
    assert_user_error(result, "gammas=[2, 1000]", "γ=1000")
    assert "gamma=1000" not in result.stderr


def test_a_symlinked_artifact_is_named_as_a_link(setup, tmp_path):  # noqa: F811
    from specpipe.recipe import load_recipe

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "recipe"
    folder.mkdir()
    (folder / "heads").symlink_to(elsewhere)
    (folder / "specpipe.yaml").write_text(yaml.safe_dump({"specpipe_recipe": 1, "target": "smollm2-135m",
                                                          "strategy": {"proposer": "ngram"},
                                                          "artifacts": {"heads": "heads"}}))
    with pytest.raises(SpecpipeError, match="symbolic link to .*elsewhere.*Copy the files into it"):
        load_recipe(folder)


def test_a_bad_value_on_a_recipe_gets_no_recipe_hint(model_dirs):  # noqa: F811
    result = specpipe("check", "recipe=recipes/smollm2-135m", "gamma=x")
    assert_user_error(result, "gamma=x")
    assert "applied first" not in result.stderr  # the hint is for an option the recipe's component lacks


# ---- settings are never silently ignored -----------------------------------------------------------------


def test_tune_refuses_prompts_and_choose_on_naming_two_sets(setup, tmp_path):  # noqa: F811
    result = specpipe("tune", f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "choose_on=dev",
                      f"out={tmp_path / 'r'}", f"work={tmp_path / 'w'}")
    assert_user_error(result, "prompts=", "choose_on=dev", "short form")
    assert not (tmp_path / "r").exists()


def test_a_prompt_record_with_a_key_it_does_not_take_is_refused(tmp_path):
    from specpipe.prompts import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "max_new_tokens": 4, "temperature": 0.7}) + "\n")
    with pytest.raises(SpecpipeError, match='line 1: the record has the key "temperature"'):
        load_prompts(str(path))


# ---- no width cuts a table ---------------------------------------------------------------------------------


def _table() -> Table:
    table = Table(title="specpipe check: m")
    for column in ("check", "status", "why", "how to fix"):
        table.add_column(column)
    table.add_row("settings", "[bold red]refuse[/bold red]", "gamma=1000 is more than 64, the most γ specpipe drafts",
                  "lower gamma")
    return table


@pytest.mark.parametrize("width", [40, 5])
def test_a_narrow_terminal_reads_every_value_whole(width):
    out = io.StringIO()
    show(_table(), Console(file=out, width=width, force_terminal=True, color_system=None))
    text = out.getvalue()
    joined = "".join(text.split())
    assert "…" not in text and "gamma=1000" in joined and "status:refuse" in joined and "howtofix:lowergamma" in joined


def test_a_pipe_gets_the_whole_table_whatever_its_width():
    out = io.StringIO()
    show(_table(), Console(file=out, width=30, force_terminal=False, color_system=None))
    assert "…" not in out.getvalue()
    assert "gamma=1000 is more than 64, the most γ specpipe drafts" in out.getvalue()


# ---- what a newcomer meets, following the docs from outside the checkout ------------------------------


def test_a_recipe_path_from_the_docs_resolves_outside_the_checkout(tmp_path, monkeypatch):
    from specpipe.recipe import find_recipe, shipped_recipes_dir

    monkeypatch.chdir(tmp_path)
    assert find_recipe("recipes/smollm2-135m") == shipped_recipes_dir() / "smollm2-135m" / "specpipe.yaml"
    with pytest.raises(SpecpipeError, match=f"looked at {tmp_path}/recipes/nothing-here"):
        find_recipe("recipes/nothing-here")


def test_a_missing_prompt_file_says_where_it_looked(tmp_path, model_dirs):  # noqa: F811
    result = specpipe("generate", f"model={model_dirs / 'target'}", "prompt_file=no/such.txt")
    assert_user_error(result, "prompt_file=no/such.txt", "looked at", "working directory")


def test_a_llama_cpp_peer_without_the_library_is_refused_before_loading(monkeypatch):
    import sys

    from specpipe.bench.peers import peer_names

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(SpecpipeError, match="peer=llama-cpp runs llama.cpp .* not installed. Nothing was run: run "
                                            "`specpipe install llamacpp`"):
        peer_names("llama-cpp", None)
    with pytest.raises(SpecpipeError, match="peer=hf-batched is the peer of a request load: add requests=N"):
        peer_names("hf-batched", None)


def test_bench_naming_no_proposer_runs_the_shipped_recipe_as_generate_does(tmp_path):
    from specpipe.recipe import load_recipe, shipped_recipe

    kind = load_recipe(shipped_recipe("smollm2-135m")).strategy["proposer"]
    for command in ("generate", "bench"):
        shown = specpipe(command, "--cfg", "job")
        assert shown.returncode == 0, shown.stderr
        config = yaml.safe_load(shown.stdout)
        assert config["proposer"]["_target_"] == f"specpipe.proposers.{kind}.build", command
        assert config["recipe"].endswith("recipes/smollm2-135m/specpipe.yaml")


def test_install_llamacpp_builds_once_for_the_same_version_and_flags(tmp_path, monkeypatch, capsys):
    from importlib import metadata

    from specpipe.commands import install
    from specpipe.engine.llamacpp import PINNED

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    builds = []
    monkeypatch.setattr(install.subprocess, "run", lambda line, env: builds.append(line) or
                        type("Done", (), {"returncode": 0})())
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: PINNED if name == "llama_cpp_python" else real(name))
    assert install.run(["llamacpp"]) == 0 and len(builds) == 2  # the build, then its dependencies
    assert install.run(["llamacpp"]) == 0 and len(builds) == 2  # the same: nothing built again
    assert "nothing to do" in " ".join(capsys.readouterr().err.split())
    assert install.run(["llamacpp", "--force"]) == 0 and len(builds) == 4
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")  # other flags: built again
    assert install.run(["llamacpp"]) == 0 and len(builds) == 6


def test_bench_tables_in_a_pipe_keep_every_cell_and_a_peers_divergence_is_not_a_failure():
    from rich.console import Group

    from specpipe.bench.table import exact_cell

    wide = Group(_table(), _table())
    out = io.StringIO()
    show(wide, Console(file=out, width=30, force_terminal=False, color_system=None))
    assert "…" not in out.getvalue() and out.getvalue().count("gamma=1000 is more than 64") == 2
    assert "FAIL" in exact_cell({"identical": 9, "of": 10, "share": 0.9})
    assert "FAIL" not in exact_cell({"identical": 9, "of": 10, "share": 0.9}, peer=True)


def test_a_cache_len_above_the_models_positions_is_said_not_silently_capped(model_dirs):  # noqa: F811
    result = specpipe("generate", "w5 w9", f"model={model_dirs / 'target'}", "cache_len=4096", "max_new_tokens=2",
                      "output=json", "baseline=false")
    assert result.returncode == 0, result.stderr
    assert "note: cache_len=4096 is more than the 256 positions" in " ".join(result.stderr.split())
