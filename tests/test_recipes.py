"""Strategies and recipes: `specpipe tune` writes one, generate/bench use it, a stranger's is checked."""

from __future__ import annotations

import json

import pytest
import yaml

from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.recipe import as_overrides, load_recipe, load_strategy, strategy_names
from test_bench import setup  # noqa: F401  (the tiny models and prompt set)
from test_cli import assert_user_error, specpipe


def write(path, data) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_every_shipped_strategy_composes():
    for name in strategy_names():
        cfg = compose([f"strategy={name}", "proposer.model=qwen2.5-coder-0.5b"] if "draft" in name else
                      [f"strategy={name}"])
        assert cfg.proposer._target_.startswith("specpipe.proposers.")


def test_strategy_settings_come_first_and_the_user_wins():
    cfg = compose(["strategy=ngram-cost", "gamma=6", "controller.window=5"])
    assert cfg.controller._target_.endswith("cost.build") and cfg.gamma == 6 and cfg.controller.window == 5
    cfg = compose(["strategy=draft", "proposer=ngram"])  # the user's proposer drops the strategy's options
    assert cfg.proposer._target_.endswith("ngram.build") and "quantize" not in cfg.proposer


@pytest.mark.full  # ~21 s; test_tune chooses and writes a recipe in CI
def test_tune_then_generate_with_the_recipe(setup, tmp_path):  # noqa: F811
    out, work = tmp_path / "recipes", tmp_path / "work"
    # report_on=none: chosen on the one prompt set, not reported on another (tests/test_tune.py has the splits)
    args = [f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "report_on=none", "max_new_tokens=12",
            "warmup=0", "strategies=[ngram,twin]", "gammas=[2,3]", f"out={out}", f"work={work}"]
    result = specpipe("tune", *args)
    assert result.returncode == 0, result.stderr
    recipe = load_recipe(out / "target")  # a folder holding specpipe.yaml
    assert recipe.target == str(setup / "target")
    chosen_on = recipe.measured["choose_on"]["speedup"]
    assert set(chosen_on) == {"ngram-g2", "ngram-g3", "twin-g2", "twin-g3"} and recipe.measured["report_on"] is None
    winner = recipe.measured["winner"]
    if winner == "plain":
        assert recipe.strategy["proposer"] == "none"
    else:  # the recipe holds the winner's strategy and figures
        assert recipe.strategy["proposer"] == winner.split("-")[0]
        assert recipe.strategy["gamma"] == int(winner[-1])
        assert recipe.measured["speedup_median"] == pytest.approx(chosen_on[winner]["median"], abs=1e-3)
        assert recipe.measured["speedup_median"] > 1.0 and "report_on=none" in recipe.measured["why"]
    assert recipe.versions["torch"] and "winner" in recipe.measured

    # a second tune resumes from the candidates' results instead of measuring again
    again = specpipe("tune", *args, "overwrite=true")  # the recipe it wrote is replaced only when told to
    assert again.returncode == 0 and again.stderr.count("measured in an earlier run") == 4

    # the recipe's target is a folder outside the recipe's: the recipe alone may not open it
    assert_user_error(specpipe("check", f"recipe={out / 'target'}"), "target", "outside", "model=PATH")
    gen = specpipe("generate", f"recipe={out / 'target'}", f"model={setup / 'target'}", "max_new_tokens=8",
                   "output=json")
    assert gen.returncode == 0, gen.stderr
    config = json.loads(gen.stdout)["config"]
    assert config["model"]["name"] == str(setup / "target")
    assert config["recipe"] == str(out / "target" / "specpipe.yaml")
    assert (config["proposer"]["_target_"] or ".none.").split(".")[-2] == recipe.strategy["proposer"]


def test_tune_measures_a_batch_schedule(setup, tmp_path):  # noqa: F811
    """batch_sizes=[2]: a strategy is served as a request load at concurrency 2 once per γ; the
    best γ there (0 if none beats plain) is its schedule, which a recipe carries and composes."""
    from rich.console import Console

    from specpipe.commands import bench, tune

    cfg = compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "max_new_tokens=12",
                   "warmup=0", "gammas=[2,3]", "batch_sizes=[2]", "requests=4", f"out={tmp_path / 'recipes'}",
                   f"work={tmp_path / 'work'}"], "tune")
    strategy = {"proposer": "ngram", "controller": "fixed", "gamma": 3}
    schedule, measured = tune.batch_schedule(cfg, "ngram-g3", strategy, bench.select_prompts(cfg), Console())
    assert set(schedule) == {1, 2} and schedule[1] == 3 and schedule[2] in (0, 2, 3)
    speedups = measured[2]["speedup_by_gamma"]
    assert set(speedups) == {2, 3} and measured[2]["gamma"] == schedule[2]
    assert schedule[2] == (max(speedups, key=speedups.get) if max(speedups.values()) > 1.0 else 0)
    jobs = sorted(p.name for p in (tmp_path / "work" / "target").iterdir())
    assert jobs == ["ngram-g3-batch2-g2", "ngram-g3-batch2-g3"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"specpipe_recipe": 1, "target": str(setup / "target"),
                                      "strategy": {**strategy, "batch_schedule": schedule}}))
    assert dict(compose([f"recipe={recipe}", f"model={setup / 'target'}"]).batch_schedule) == schedule


def test_a_recipe_beside_the_model_is_found_from_the_model(setup, tmp_path):  # noqa: F811
    folder = tmp_path / "model"
    folder.mkdir()
    for f in (setup / "target").iterdir():
        (folder / f.name).symlink_to(f)
    write(folder / "specpipe.yaml", {"specpipe_recipe": 1, "target": ".",
                                     "strategy": {"proposer": "ngram", "controller": "fixed", "gamma": 3}})
    cfg = compose([f"model={folder}"])
    assert cfg.proposer._target_.endswith("ngram.build") and cfg.gamma == 3
    cfg = compose([f"model={folder}", "gamma=5"])
    assert cfg.gamma == 5


def test_round_trip_keeps_every_setting(tmp_path):
    strategy = {"proposer": "ngram", "proposer.ngram_max": 5, "controller": "cost", "controller.window": 7,
                "gamma": 3, "gamma_max": 6, "verifier": "rejection", "temperature": 0.5, "top_p": 0.9}
    path = write(tmp_path / "r" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                    "strategy": strategy, "measured": {"speedup_median": 1.5}})
    recipe = load_recipe(path)
    assert recipe.strategy == strategy and recipe.measured == {"speedup_median": 1.5}
    cfg = compose([f"recipe={path}"])
    assert (cfg.proposer.ngram_max, cfg.controller.window, cfg.gamma, cfg.gamma_max) == (5, 7, 3, 6)
    assert cfg.verifier._target_.endswith("rejection.build") and (cfg.temperature, cfg.top_p) == (0.5, 0.9)
    assert cfg.model.name == "smollm2-135m"
    assert as_overrides(strategy)[:3] == ["controller=cost", "proposer=ngram", "verifier=rejection"]



def test_a_recipe_holds_a_tree_shape(tmp_path):
    """proposer.tree, EAGLE-2's shape, is the strategy's other mapping: it reaches the proposer
    as the override a user would type, and a bad shape is refused by name."""
    strategy = {"proposer": "eagle3", "proposer.tree": {"top_k": 4, "nodes": 15}, "gamma": 6}
    path = write(tmp_path / "r" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                    "strategy": strategy})
    assert load_recipe(path).strategy["proposer.tree"] == {"top_k": 4, "nodes": 15}
    assert "proposer.tree={top_k:4,nodes:15}" in as_overrides(strategy)
    assert dict(compose([f"recipe={path}"]).proposer.tree) == {"top_k": 4, "nodes": 15}
    for bad in ({"top_k": 4, "depth": 3}, {"top_k": "4"}, {"top_k": 0}, "wide"):
        path = write(tmp_path / "bad" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                          "strategy": {**strategy, "proposer.tree": bad}})
        with pytest.raises(SpecpipeError, match="proposer.tree"):
            load_recipe(path)



def test_a_recipes_precision_stays_when_the_user_names_its_model(tmp_path):
    """`model=` repeating the recipe's own target (as bench commands do) keeps the recipe's
    model.quantize; the user's own model.quantize still wins."""
    path = write(tmp_path / "r" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                    "strategy": {"proposer": "ngram", "model.quantize": "bf16"}})
    assert compose([f"recipe={path}", "model=smollm2-135m"]).model.quantize == "bf16"
    assert compose([f"recipe={path}", "model=smollm2-135m", "model.quantize=w8a16"]).model.quantize == "w8a16"


MALICIOUS = {
    "a _target_ outside specpipe": ({"strategy": {"proposer": "ngram", "proposer._target_": "os.system"}},
                                    "proposer._target_", "only name build functions under `specpipe.`"),
    "an unknown top-level key": ({"strategy": {"proposer": "ngram"}, "hooks": ["rm -rf /"]}, "hooks", "unknown keys"),
    "an unknown strategy key": ({"strategy": {"proposer": "ngram", "hydra.run.dir": "/etc"}}, "hydra.run.dir",
                                "not a strategy setting"),
    "a group choice that is a path": ({"strategy": {"proposer": "../../evil"}}, "../../evil", "conf/proposer/"),
    "an artifact outside its folder": ({"strategy": {"proposer": "ngram"}, "artifacts": {"heads": "../../etc/passwd"}},
                                       "heads", "inside the recipe's folder"),
    "a nested value": ({"strategy": {"proposer": "ngram", "proposer.ngram_max": {"_target_": "os.system"}}},
                       "proposer.ngram_max", "must be a number"),
}


@pytest.mark.parametrize("case", MALICIOUS)
def test_a_malicious_recipe_is_refused(tmp_path, case):
    body, *words = MALICIOUS[case]
    path = write(tmp_path / "evil" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m", **body})
    with pytest.raises(SpecpipeError) as err:
        compose([f"recipe={path}"])
    for word in words:
        assert word in str(err.value)


def test_a_malicious_recipe_fails_cleanly_on_the_command_line(tmp_path):
    path = write(tmp_path / "evil" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                       "strategy": {"proposer._target_": "builtins.exec"}})
    assert_user_error(specpipe("generate", f"recipe={path}"), "builtins.exec", "refused")


def test_recipe_for_another_model_is_refused(tmp_path):
    path = write(tmp_path / "r" / "specpipe.yaml", {"specpipe_recipe": 1, "target": "smollm2-135m",
                                                    "strategy": {"proposer": "ngram"}})
    with pytest.raises(SpecpipeError, match="tuned for smollm2-135m"):
        compose([f"recipe={path}", "model=qwen2.5-coder-1.5b"])


def test_strategy_files_are_checked_too(tmp_path):
    path = write(tmp_path / "s.yaml", {"proposer": "ngram", "command": "rm -rf /"})
    with pytest.raises(SpecpipeError, match="'command' is not a strategy setting"):
        load_strategy(str(path))


def test_plain_generate_on_a_zoo_target_applies_its_shipped_recipe():
    """`specpipe generate` (and `check`) with no proposer, strategy or recipe decodes with
    recipes/<model>/specpipe.yaml where the checkout ships one; naming any of them, or a target
    without one, leaves conf/'s defaults."""
    from specpipe.config import conf_dir, with_shipped_recipe
    from specpipe.recipe import shipped_recipe

    shipped = shipped_recipe("smollm2-135m")
    assert shipped is not None and shipped.name == "specpipe.yaml"
    applied = with_shipped_recipe(["gamma=3"], "generate", conf_dir())
    assert applied[0].startswith("recipe=") and "smollm2-135m" in applied[0] and applied[1:] == ["gamma=3"]
    cfg = compose(applied)
    strategy = load_recipe(shipped).strategy
    assert cfg.recipe and cfg.gamma == 3
    assert cfg.proposer._target_ == f"specpipe.proposers.{strategy['proposer']}.build"
    for own in (["proposer=twin"], ["proposer.ngram_max=5"], ["strategy=ngram"], ["recipe=smollm2-135m"],
                ["model=qwen2.5-coder-1.5b"]):
        assert with_shipped_recipe(own, "check", conf_dir()) == own
