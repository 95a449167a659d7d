"""`specpipe tune` chooses on one prompt split and reports on another: the splits, their refusal
when they share a prompt, and the rule that a winner with a model ships only where it beats the
best of ngram and suffix on the report split. Tiny random models, no downloads."""

from __future__ import annotations

import json

import pytest
import yaml
from rich.console import Console

from specpipe.commands import tune
from specpipe.commands import tune_split as split
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.recipe import load_recipe
from test_bench import setup  # noqa: F401  (the tiny models and prompt set)
from test_cli import assert_user_error, specpipe


def prompt_file(path, offset: int, categories=("edit", "chat")) -> str:
    """Prompts of repeated words (so lookups find matches), none the same as the setup's."""
    lines = []
    for i, category in enumerate(categories):
        words = " ".join(f"w{(offset + i * 5 + j) % 60 + 2}" for j in range(8))
        lines.append({"id": f"r{offset}-{i}", "category": category,
                      "messages": [{"role": "user", "content": f"{words} . {words}"}]})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_tune_chooses_on_one_split_and_reports_on_the_other(setup, tmp_path):  # noqa: F811
    out, work = tmp_path / "recipes", tmp_path / "work"
    report = prompt_file(tmp_path / "report.jsonl", 31, ("edit", "chat", "other"))
    args = [f"model={setup / 'target'}", f"choose_on={setup / 'prompts.jsonl'}", f"report_on={report}",
            "max_new_tokens=12", "warmup=0", "strategies=[ngram,suffix]", "gammas=[2,3]", f"out={out}",
            f"work={work}"]
    result = specpipe("tune", *args)
    assert result.returncode == 0, result.stderr
    measured = load_recipe(out / "target").measured
    choose, reported = measured["choose_on"], measured["report_on"]
    assert (choose["set"], choose["prompts"]) == (str(setup / "prompts.jsonl"), 3)
    assert (reported["set"], reported["prompts"], reported["categories"]) == (report, 3, [])
    assert set(choose["speedup"]) == {"ngram-g2", "ngram-g3", "suffix-g2", "suffix-g3"}
    for figures in [*choose["speedup"].values(), *reported["speedup"].values()]:
        assert figures["min"] <= figures["p25"] <= figures["median"] <= figures["p75"] <= figures["max"]
    # on the report split: the chosen winner and the best ngram and suffix candidates of the choose split
    best = {family: max((n for n in choose["speedup"] if n.startswith(family)),
                        key=lambda n: choose["speedup"][n]["median"]) for family in ("ngram", "suffix")}
    assert set(reported["speedup"]) == set(best.values()) | ({measured["chosen"]} - {"plain"})
    if measured["winner"] != "plain":  # a simple winner ships as chosen; its headline is the report split's
        assert measured["winner"] == measured["chosen"] and measured["figures_from"] == "report_on"
        assert measured["speedup_median"] == pytest.approx(reported["speedup"][measured["winner"]]["median"], abs=1e-3)
    assert f"choose_on={setup / 'prompts.jsonl'}" in measured["command"] and "gammas=[2,3]" in measured["command"]
    shown = " ".join(result.stdout.split())
    assert f"reported on {report}" in shown and "reported on" in shown and "ngram-g2" in shown
    for name in reported["speedup"]:  # each split's results kept apart, so a rerun resumes both
        assert (work / "target" / name / "report_on" / "results.json").is_file()

    again = specpipe("tune", *args, "overwrite=true")  # its recipe is there now: replaced only when told to
    assert again.returncode == 0 and again.stderr.count("measured in an earlier run with the same") == 4 + len(
        reported["speedup"])


@pytest.mark.parametrize("report, why", [
    ("same", ["share 3 of the 3 prompts", "p0, p1, p2"]),
    ("renamed", ["share 1 of the 3 prompts", "copy-of-p2"]),  # a prompt is its text, whatever its id
])
def test_splits_that_share_a_prompt_are_refused_before_anything_runs(setup, tmp_path, report, why):  # noqa: F811
    prompts = setup / "prompts.jsonl"
    if report == "renamed":
        last = json.loads(prompts.read_text().splitlines()[2])
        prompt_file(tmp_path / "r.jsonl", 40)
        (tmp_path / "r.jsonl").write_text((tmp_path / "r.jsonl").read_text()
                                          + json.dumps({**last, "id": "copy-of-p2"}) + "\n")
    other = prompts if report == "same" else tmp_path / "r.jsonl"
    result = specpipe("tune", f"model={setup / 'target'}", f"prompts={prompts}", f"report_on={other}",
                      f"out={tmp_path / 'recipes'}", f"work={tmp_path / 'work'}")
    assert_user_error(result, "choose_on=", "report_on=", *why, "no prompt in common", "report_on=none")
    assert "\n\n" not in result.stderr.strip()  # one paragraph
    assert not (tmp_path / "recipes").exists() and not (tmp_path / "work").exists()  # nothing half-written


def test_spec_bench_is_never_chosen_on(setup, tmp_path):  # noqa: F811
    with pytest.raises(SpecpipeError, match="Spec-Bench is the benchmark the field reports on"):
        split.select_splits(compose(["choose_on=spec-bench", "limit=1", "report_on=none"], "tune"))
    choose, report = split.select_splits(compose(["limit=1", "report_on=spec-bench"], "tune"))  # reporting on it is fine
    assert len(choose) == 6 and len(report) == 6
    result = specpipe("tune", f"model={setup / 'target'}", "prompts=dev+spec-bench", "limit=1", "report_on=none",
                      f"out={tmp_path / 'recipes'}", f"work={tmp_path / 'work'}")
    assert_user_error(result, "Spec-Bench prompts", "choose_on=dev")
    assert not (tmp_path / "recipes").exists() and not (tmp_path / "work").exists()


def test_the_default_splits_are_disjoint_and_a_missing_set_is_refused(setup, tmp_path):  # noqa: F811
    choose, report = split.select_splits(compose(["limit=2"], "tune"))  # dev and held-aside
    assert len(choose) == 12 and len(report) == 8 and {p["category"] for p in report} == {
        "creative", "languages", "long-chat", "structured"}
    # categories= picks among the choose split's categories; the report split keeps its own
    choose, report = split.select_splits(compose(["categories=[chat]", "limit=1"], "tune"))
    assert [p["category"] for p in choose] == ["chat"] and len(report) == 4
    assert split.select_splits(compose(["report_on=none"], "tune"))[1] == []
    result = specpipe("tune", f"model={setup / 'target'}", "report_on=nowhere.jsonl", f"out={tmp_path / 'recipes'}",
                      f"work={tmp_path / 'work'}")
    assert_user_error(result, "nowhere.jsonl", "was not found")
    assert not (tmp_path / "recipes").exists() and not (tmp_path / "work").exists()


def results(median: float, exact: bool = True) -> dict:
    """The part of a bench payload tune reads: one prompt per split category, spread around `median`."""
    overall = {"speedup": {"median": median, "min": median - 0.2, "p25": median - 0.1, "p75": median + 0.1,
                           "max": median + 0.2},
               "exactness": {"identical": 2 if exact else 1, "of": 2, "share": 1.0 if exact else 0.5},
               "acceptance_rate": 0.5, "mean_accepted_length": 2.0, "gamma": {"mean": 3.0},
               "tokens_per_s": 60.0 * median, "baseline_tokens_per_s": 60.0}
    return {"summary": {"code": overall, "overall": overall}}


HEAD = {"proposer": "eagle", "controller": "confidence"}
TRIED = {"ngram-g4": ({"proposer": "ngram", "gamma": 4}, results(1.80)),
         "suffix-g6": ({"proposer": "suffix", "gamma": 6}, results(1.60)),
         "eagle": (HEAD, results(1.87))}


@pytest.mark.parametrize("head, ngram, suffix, shipped", [
    (results(1.60), results(1.50), results(1.55), "eagle"),  # beats both: the head ships
    (results(1.46), results(1.51), results(1.56), "suffix-g6"),  # loses: the better simple one ships
    (results(1.56), results(1.50), results(1.56), "suffix-g6"),  # a tie is no win
    (results(1.90, exact=False), results(1.51), results(1.56), "suffix-g6"),  # diverged: never shipped
    (results(1.90, exact=False), results(1.51, exact=False), results(1.56, exact=False), None),
])
def test_a_model_ships_only_where_it_beats_ngram_and_suffix_on_the_report_split(head, ngram, suffix, shipped):
    reported = {"eagle": head, "ngram-g4": ngram, "suffix-g6": suffix}
    name, why = split.shipped(TRIED, "eagle", reported, "held-aside")
    assert name == shipped and "held-aside" in why
    if shipped == "suffix-g6" and head["summary"]["overall"]["exactness"]["share"] == 1.0:
        assert "did not beat suffix-g6" in why and f"{split.median(head):.2f}x against 1.56x" in why


def test_the_rule_leaves_simple_winners_and_lone_heads_alone():
    reported = {"ngram-g4": results(1.40), "suffix-g6": results(1.56)}
    assert split.shipped(TRIED, "ngram-g4", reported, "held-aside")[0] == "ngram-g4"  # chosen on the choose split
    lone = {"eagle": (HEAD, results(1.87))}
    name, why = split.shipped(lone, "eagle", {"eagle": results(1.2)}, "held-aside")
    assert name == "eagle" and "strategies= left them out" in why
    assert split.shipped(TRIED, None, {}, "held-aside") == (None, "no exact candidate beat the plain target on the "
                                                                  "choose split, so speculation is off")
    assert "report_on=none" in split.shipped(TRIED, "eagle", {}, "")[1]
    assert split.to_report(TRIED, "eagle") == ["eagle", "ngram-g4", "suffix-g6"]
    assert split.to_report(TRIED, "ngram-g4") == ["ngram-g4", "suffix-g6"]


def test_tune_writes_the_best_simple_strategy_when_the_head_loses_on_the_report_split(setup, tmp_path,  # noqa: F811
                                                                                       monkeypatch):
    """The whole command, with the measurements stubbed: EAGLE wins the choose split, loses to
    suffix on the report split, and the recipe holds suffix, both splits' figures and why."""
    out = tmp_path / "recipes"
    (out / "target" / "eagle").mkdir(parents=True)  # a trained head's recipe beside the destination
    (out / "target" / "eagle.yaml").write_text(yaml.safe_dump({
        "specpipe_recipe": 1, "target": str(setup / "target"), "artifacts": {"heads": "eagle"},
        "strategy": {"proposer": "eagle", "proposer.heads": "artifact:heads", "controller": "confidence"}}))
    choose = {"ngram-g4": 1.80, "suffix-g4": 1.63, "eagle": 1.87}
    report = {"ngram-g4": 1.51, "suffix-g4": 1.56, "eagle": 1.46}
    measured = []

    def bench(cfg, name, strategy, prompts, err, load=0, on=""):
        measured.append((name, on, cfg.prompts, len(prompts)))
        return results((report if on else choose)[name])

    monkeypatch.setattr(tune, "_bench_candidate", bench)
    report_file = prompt_file(tmp_path / "report.jsonl", 31)
    cfg = compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", f"report_on={report_file}",
                   "strategies=[ngram,suffix]", "gammas=[4]", f"out={out}", f"work={tmp_path / 'work'}"], "tune")
    assert tune.run(cfg) == 0
    assert measured[-3:] == [(n, "report_on", report_file, 2) for n in ("eagle", "ngram-g4", "suffix-g4")]
    assert {(n, p) for n, on, p, _ in measured if not on} == {(n, str(setup / "prompts.jsonl")) for n in choose}
    recipe = load_recipe(out / "target")
    assert recipe.strategy["proposer"] == "suffix" and recipe.artifacts == {}
    m = recipe.measured
    assert (m["winner"], m["chosen"], m["figures_from"], m["speedup_median"]) == ("suffix-g4", "eagle", "report_on", 1.56)
    assert "eagle won the choose split but did not beat suffix-g4" in m["why"] and "1.46x against 1.56x" in m["why"]
    assert m["choose_on"]["speedup"]["eagle"] == {"median": 1.87, "min": 1.67, "p25": 1.77, "p75": 1.97, "max": 2.07,
                                                  "exact": True}
    assert set(m["report_on"]["speedup"]) == set(report) and m["report_on"]["set"] == report_file


def test_the_table_shows_both_splits_and_why(setup, tmp_path):  # noqa: F811
    cfg = compose([f"model={setup / 'target'}", "limit=2"], "tune")
    reported = {"eagle": results(1.46), "ngram-g4": results(1.51), "suffix-g6": results(1.56)}
    ship = split.shipped(TRIED, "eagle", reported, "held-aside")
    console = Console(width=220, record=True)
    console.print(split.table(cfg, TRIED, reported, ship))
    shown = " ".join(console.export_text().split())
    assert "chosen on dev, reported on held-aside" in shown and "1.56x (1.36-1.76)" in shown
    assert "★ suffix-g6" in shown and "did not beat suffix-g6" in shown


def test_an_interrupted_candidate_resumes_from_its_own_folder(setup, tmp_path, monkeypatch, capsys):  # noqa: F811
    """What a candidate measured before an interruption is kept in its folder under work= (not in
    bench's default out=, where the next candidate or run would find it), and read back once."""
    from specpipe.bench.partial import PARTIAL_FILE
    from specpipe.commands import bench

    monkeypatch.chdir(tmp_path)
    real = bench.bench_prompts

    def one_then_interrupt(*args, on_result, **kwargs):
        def keep_then_stop(result):
            on_result(result)
            raise KeyboardInterrupt
        return real(*args, on_result=keep_then_stop, **kwargs)

    cfg = compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "report_on=none",
                   "max_new_tokens=6", "warmup=0", "strategies=[ngram]", "gammas=[2]", "out=recipes", "work=work"],
                  "tune")
    monkeypatch.setattr(bench, "bench_prompts", one_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        tune.run(cfg)
    kept = tmp_path / "work" / "target" / "ngram-g2" / PARTIAL_FILE
    assert len(json.loads(kept.read_text())["prompts"]) == 1
    monkeypatch.setattr(bench, "bench_prompts", real)
    capsys.readouterr()
    assert tune.run(cfg) == 0
    assert "resuming: 1 of 3 prompts" in " ".join(capsys.readouterr().err.split())
    assert not kept.exists() and (kept.parent / "results.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipes", "work"]  # no bench-results/ beside them


def test_the_recorded_command_names_both_splits_and_what_differs_from_the_defaults():
    import shlex

    typed = ["limit=2", "strategies=[ngram,suffix]", "model.quantize=fp32", "report_on=none"]
    line = tune.command(compose(typed, "tune"))
    assert line == ("specpipe tune model=smollm2-135m model.quantize=fp32 choose_on=dev report_on=none limit=2 "
                    "'strategies=[ngram,suffix]'")
    again = compose(shlex.split(line)[2:], "tune")  # typed back, it composes the same settings
    assert all(again[k] == v for k, v in compose(typed, "tune").items() if k != "model") and again.model.quantize == "fp32"
