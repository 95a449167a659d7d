"""The built-in `spec-bench` prompt set (Spec-Bench's first turns), its sample by `limit=`, and
the bench table in Spec-Bench's layout, computed from per-prompt results of known numbers."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import torch
from rich.console import Console

from conftest import tiny_model, tiny_tokenizer
from specpipe import cli
from specpipe.bench.results import read_results
from specpipe.bench.records import Measured, PromptResult
from specpipe.bench.spec_bench import CATEGORIES, is_spec_bench, spec_bench_figures, spec_bench_table
from specpipe.commands.bench import select_prompts
from specpipe.config import compose
from specpipe.prompts import BUILTIN, load_prompts

ROOT = Path(__file__).resolve().parents[1]
SIX = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def converter():
    path = ROOT / "benchmarks" / "spec_bench_prompts.py"
    spec = importlib.util.spec_from_file_location("spec_bench_prompts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the set


def test_the_set_holds_spec_benchs_480_first_turns_in_six_categories():
    prompts = load_prompts("spec-bench")  # the validator every reader goes through
    assert len(prompts) == 480
    assert Counter(p["category"] for p in prompts) == {c: 80 for c in SIX}
    assert list(dict.fromkeys(p["category"] for p in prompts)) == SIX  # Spec-Bench's order
    assert [p["id"] for p in prompts] == [f"spec-bench-{n}" for n in range(81, 561)]  # its question ids
    # first turns only: one user message each; MT-bench's first question without its second turn
    assert all([m["role"] for m in p["messages"]] == ["user"] for p in prompts)
    first = prompts[0]["messages"][0]["content"]
    assert first.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert "Rewrite your previous response" not in first
    assert all("max_new_tokens" not in p for p in prompts)  # the command's max_new_tokens= applies


def test_the_set_ships_with_its_attribution():
    notice = (BUILTIN["spec-bench"].parent / "spec-bench.NOTICE").read_text(encoding="utf-8")
    for words in ("https://github.com/hemingkx/Spec-Bench", "Apache License", "Version 2.0",
                  "only the first turn of each of the 480 questions is kept"):
        assert words in " ".join(notice.split()), words
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in ("spec-bench.jsonl", "spec-bench.NOTICE"):  # both in the wheel
        assert any(fnmatch.fnmatch(name, p) for p in patterns["specpipe.prompts"]), name


def test_the_converter_keeps_the_first_turn_under_spec_benchs_reported_category():
    module = converter()
    mt = {"question_id": 81, "category": "writing", "turns": ["first", "second"]}
    qa = {"question_id": 321, "category": "qa", "turns": ["Who?"], "reference": ["someone"]}
    assert module.convert(mt) == {"id": "spec-bench-81", "category": "mt_bench",
                                  "messages": [{"role": "user", "content": "first"}]}
    assert module.convert(qa) == {"id": "spec-bench-321", "category": "qa",
                                  "messages": [{"role": "user", "content": "Who?"}]}
    shipped = [json.loads(line) for line in BUILTIN["spec-bench"].read_text(encoding="utf-8").splitlines()]
    module.check(shipped)  # the shipped file passes the converter's own check
    with pytest.raises(SystemExit, match="80 questions in each"):
        module.check(shipped[:-1])


def test_prompts_names_the_set_alone_or_joined():
    assert is_spec_bench("spec-bench") and is_spec_bench("dev+spec-bench")
    assert not is_spec_bench("dev") and not is_spec_bench("runs/spec-bench.jsonl")
    joined = load_prompts("dev+spec-bench")
    assert len(joined) == len(load_prompts("dev")) + 480


# a sample: limit= is per category


def test_limit_takes_the_first_prompts_of_each_category():
    prompts = select_prompts(compose(["prompts=spec-bench", "limit=2"], "bench"))
    assert Counter(p["category"] for p in prompts) == {c: 2 for c in SIX}
    everything = load_prompts("spec-bench")
    for category in SIX:
        ids = [p["id"] for p in prompts if p["category"] == category]
        assert ids == [p["id"] for p in everything if p["category"] == category][:2]
    picked = select_prompts(compose(["prompts=spec-bench", "limit=1", "categories=[qa,rag]"], "bench"))
    assert [p["id"] for p in picked] == ["spec-bench-321", "spec-bench-481"]


def test_a_negative_limit_is_a_user_error(capsys):
    assert cli.main(["bench", "prompts=spec-bench", "limit=-1"]) == 2
    err = capsys.readouterr().err
    assert "limit=-1" in err and "Traceback" not in err


# the table in Spec-Bench's layout


def result(id: str, category: str, plain: float, spec: float, new_tokens: int, steps: int,
           peer: float | None = None) -> PromptResult:
    stats = {"new_tokens": new_tokens, "steps": steps}
    peers = {"llama-cpp": Measured([], peer)} if peer is not None else {}
    return PromptResult(id, category, 10, Measured([], plain), Measured([], spec, stats=stats), peers=peers)


RESULTS = [
    # mt_bench: mean 40 tok/s over mean 20 = 2.00x (the median of per-prompt ratios would be 2.33x)
    result("a", "mt_bench", plain=10.0, spec=30.0, new_tokens=20, steps=10, peer=10.0),
    result("b", "mt_bench", plain=30.0, spec=50.0, new_tokens=30, steps=5, peer=30.0),
    result("c", "translation", plain=20.0, spec=10.0, new_tokens=8, steps=8, peer=40.0),
    result("d", "code", plain=1.0, spec=100.0, new_tokens=100, steps=1, peer=1.0),  # not Spec-Bench's
]


def test_the_figures_group_by_spec_benchs_categories_with_its_definitions():
    figures = spec_bench_figures([r.to_dict() for r in RESULTS])
    assert list(figures) == ["mt_bench", "translation", "overall"]  # "code" is another set's
    assert figures["mt_bench"]["prompts"] == 2 and figures["overall"]["prompts"] == 3
    assert figures["mt_bench"]["speedup"] == pytest.approx(2.0)
    assert figures["mt_bench"]["tau"] == pytest.approx(50 / 15)  # pooled steps, not a mean of means
    assert figures["translation"]["speedup"] == pytest.approx(0.5) and figures["translation"]["tau"] == 1.0
    assert figures["overall"]["speedup"] == pytest.approx(30 / 20)
    assert figures["overall"]["tau"] == pytest.approx(58 / 23)
    assert figures["mt_bench"]["peers"] == {"llama-cpp": pytest.approx(1.0)}
    assert figures["overall"]["peers"] == {"llama-cpp": pytest.approx((80 / 3) / 20)}
    assert spec_bench_figures([RESULTS[3].to_dict()]) == {}


def test_the_table_prints_a_column_per_category_and_overall():
    payload = {"model": "tiny", "strategy": {"proposer": "suffix"}, "prompts": [r.to_dict() for r in RESULTS]}
    console = Console(record=True, width=300)
    console.print(spec_bench_table(payload))
    lines = console.export_text().splitlines()
    head = next(line for line in lines if "Multi-turn Conversation" in line)
    assert [h for h in CATEGORIES.values()] == sorted(CATEGORIES.values(), key=head.index)
    assert "Multi-turn Conversation (2)" in head and "Translation (1)" in head and "Overall (3)" in head
    rows = {cells[0]: cells[1:] for cells in (_cells(line) for line in lines) if cells}
    # mt_bench, translation, four categories without prompts, τ overall, the overall speedup
    assert rows["suffix speedup"] == ["2.00x", "0.50x", "-", "-", "-", "-", "2.52", "1.50x"]
    assert rows["τ"] == ["3.33", "1.00", "-", "-", "-", "-", "", "2.52"]
    assert rows["↳ llama-cpp"] == ["1.00x", "2.00x", "-", "-", "-", "-", "", "1.33x"]


def _cells(line: str) -> list[str]:
    """A body row's cells as text (rich draws them between │)."""
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_bench_over_spec_bench_prints_the_layout(tmp_path, capsys, monkeypatch):
    """End to end on a tiny model, with one prompt each of two categories whose prompts it can hold."""
    tokenizer, model = tiny_tokenizer(), tiny_model(0, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    monkeypatch.setenv("COLUMNS", "300")  # rich's width: the table's columns unwrapped
    code = cli.main(["bench", f"model={tmp_path / 'target'}", "prompts=spec-bench", "categories=[qa,math_reasoning]",
                     "limit=1", "max_new_tokens=4", "warmup=0", "proposer=ngram", f"out={tmp_path / 'out'}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Spec-Bench layout" in out and "Question Answering (1)" in out and "Overall (2)" in out
    assert "Multi-turn Conversation (0)" in out
    overall = spec_bench_figures(read_results(tmp_path / "out" / "results.json")["prompts"])["overall"]
    assert f"{overall['speedup']:.2f}x" in out.split("Spec-Bench layout")[1]  # the run's own figures
