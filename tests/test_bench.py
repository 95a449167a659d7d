"""`specpipe bench`, sweeps and `specpipe report`, end to end on tiny models (subprocesses, no network)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import tiny_model, tiny_target, tiny_tokenizer
from specpipe.bench.results import SCHEMA, read_results, validate
from specpipe.bench.runner import warm_up
from specpipe.bench.summary import _quantile, gamma_summary, spread
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.guard import Guard
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from specpipe.proposers.ngram import NgramProposer
from specpipe.verifiers.greedy import GreedyVerifier
from test_cli import assert_user_error, specpipe

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target, a draft with its tokenizer, and a 3-prompt set in two categories."""
    root = tmp_path_factory.mktemp("bench")
    for name, seed in (("target", 0), ("draft", 3)):
        tokenizer = tiny_tokenizer()
        model = tiny_model(seed, dtype=torch.float32)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    lines = []
    for i, category in enumerate(["edit", "edit", "chat"]):
        words = " ".join(f"w{(i * 7 + j) % 60 + 2}" for j in range(10))
        # repeat the words so the n-gram proposer finds matches
        lines.append({"id": f"p{i}", "category": category,
                      "messages": [{"role": "user", "content": f"{words} {words}"}]})
    (root / "prompts.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return root


def base_args(setup, *extra: str) -> list[str]:
    return [f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "max_new_tokens=10", "warmup=0", *extra]


def test_bench_writes_results_table_and_plots(setup, tmp_path):
    out = tmp_path / "run"
    result = specpipe("bench", *base_args(setup, "proposer=draft", f"proposer.model={setup / 'draft'}",
                                          "proposer.quantize=none", "peer=[hf-assisted,hf-prompt-lookup]",
                                          "plot=true", f"out={out}"))
    assert result.returncode == 0, result.stderr
    payload = read_results(out / "results.json")  # validates the schema
    assert payload["schema"] == SCHEMA and payload["strategy"]["proposer"] == "draft"
    assert [p["category"] for p in payload["prompts"]] == ["edit", "edit", "chat"]
    assert list(payload["summary"]) == ["edit", "chat", "overall"]
    overall = payload["summary"]["overall"]
    assert overall["prompts"] == 3 and overall["exactness"]["share"] == 1.0
    assert set(overall["peers"]) == {"hf-assisted", "hf-prompt-lookup"}
    assert all(p["peers_exact"] == {"hf-assisted": True, "hf-prompt-lookup": True} for p in payload["prompts"])
    assert overall["time_per_token_ms"]["speculative"]["p50"] > 0
    for prompt in payload["prompts"]:  # speedup is per prompt, against that prompt's plain run
        assert prompt["speedup"] == pytest.approx(prompt["speculative"]["tokens_per_s"] / prompt["baseline"]["tokens_per_s"])
        assert len(prompt["speculative"]["token_ids"]) == 10
    for name in ("speedup_by_category.png", "per_position_acceptance.png", "speedup_vs_gamma.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    assert "speedup" in result.stdout and "overall" in result.stdout and "hf-prompt-lookup" in result.stdout

    again = specpipe("bench", *base_args(setup, "proposer=ngram", "limit=1", f"out={out}"))
    assert again.returncode == 0, again.stderr
    assert len(list(out.glob("results-*.json"))) == 1  # the earlier results were kept, renamed
    assert read_results(out / "results.json")["summary"]["overall"]["prompts"] == 2  # limit: per category


def test_sweep_resumes_after_a_killed_job_and_reports(setup, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["bench", "-m", "proposer=ngram,twin", "gamma=2,3", *base_args(setup, f"out={sweep}")]
    log = (tmp_path / "killed.log").open("w")  # a file, not a pipe: nobody reads a pipe, and a full one blocks the child
    proc = subprocess.Popen([sys.executable, "-m", "specpipe", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 240
    while not list(sweep.rglob("results.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # killed in the middle of the sweep
    proc.wait()
    log.close()
    finished = {p: p.read_bytes() for p in sweep.rglob("results.json")}  # a redone job measures new timings
    assert 1 <= len(finished) < 4, (tmp_path / "killed.log").read_text()[-3000:]

    result = specpipe(*args)
    assert result.returncode == 0, result.stderr
    assert "skipped" in result.stderr
    jobs = sorted(sweep.rglob("results.json"))
    assert len(jobs) == 4
    assert {p.parent.name for p in jobs} == {f"gamma={g},max_new_tokens=10,model=target,proposer={p}"
                                            for g in (2, 3) for p in ("ngram", "twin")}
    for path, content in finished.items():  # what finished before the kill was not redone
        assert path.read_bytes() == content
    assert "4 finished job(s)" in result.stdout  # the sweep's table at the end

    report = specpipe("report", str(sweep), "plot=true")
    assert report.returncode == 0, report.stderr
    summary = json.loads((sweep / "summary.json").read_text())
    assert len(summary["jobs"]) == 4
    assert {(j["proposer"], j["gamma"]) for j in summary["jobs"]} == {("ngram", 2), ("ngram", 3), ("twin", 2), ("twin", 3)}
    for name in ("sweep_speedup_vs_gamma.png", "sweep_speedup_by_category.png"):
        assert (sweep / name).read_bytes().startswith(PNG)


def test_bench_bad_input_is_one_clear_error(setup, tmp_path):
    assert_user_error(specpipe("bench", *base_args(setup, "peer=vllm", f"out={tmp_path}")), "peer=vllm", "hf-assisted")
    assert_user_error(specpipe("bench", *base_args(setup, "peer=hf-assisted", f"out={tmp_path}")),
                      "needs a draft model")
    assert_user_error(specpipe("bench", f"model={setup / 'target'}", "prompts=nowhere.jsonl"), "nowhere.jsonl")
    assert_user_error(specpipe("bench", *base_args(setup, "categories=[poetry]")), "poetry")
    assert_user_error(specpipe("report", str(tmp_path / "empty")), "not a folder")
    assert not list(tmp_path.rglob("results.json"))


def test_summary_statistics():
    assert _quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert _quantile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    s = spread([1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"]) == (2.5, 1.0, 4.0)
    g = gamma_summary([0, 4, 4, 2])
    assert g["off_share"] == 0.25 and g["histogram"] == {"0": 1, "2": 1, "4": 2} and g["mean"] == 2.5


def test_results_schema_is_checked():
    with pytest.raises(SpecpipeError, match="not a specpipe bench result"):
        validate({"schema": "other"})
    with pytest.raises(SpecpipeError, match="prompts"):
        validate({"schema": SCHEMA, "created": "x", "model": "m", "strategy": {}, "config": {},
                  "environment": {}, "summary": {"overall": {}}})


def test_request_load_serves_a_stream_plain_and_speculative(setup, tmp_path):
    """requests=N concurrency=C: every request's output equals the plain run's, the figures a
    load reports are there, and the sweep over concurrency is one report with its plot."""
    out = tmp_path / "load"
    result = specpipe("bench", *base_args(setup, "proposer=ngram", "gamma=3", "requests=7", "concurrency=3",
                                          "peer=hf-batched", "plot=true", f"out={out}"))
    assert result.returncode == 0, result.stderr
    payload = read_results(out / "results.json")
    load = payload["load"]
    assert payload["schema"] == SCHEMA and load["requests"] == 7 and load["slots"] == 3
    assert load["exact"]["share"] == 1.0 and load["peers"]["hf-batched"]["exact"]["share"] == 1.0
    for mode in ("plain", "speculative"):
        figures = load[mode]
        assert figures["tokens_per_s"] > 0 and figures["requests_per_s"] > 0
        for key in ("latency_ms", "ttft_ms", "tpot_ms"):
            assert figures[key]["p50"] <= figures[key]["p90"] <= figures[key]["p99"]
    assert set(load["by_category"]) == {"edit", "chat"}
    assert sum(c["requests"] for c in load["by_category"].values()) == 7
    assert {batch for _, batch, _ in load["gamma_over_time"]} <= {1, 2, 3} and load["gamma_over_time"]
    assert (out / "gamma_over_time.png").read_bytes().startswith(PNG)
    assert "request load: 7 requests, concurrency 3" in " ".join(result.stdout.split())

    sweep = tmp_path / "sweep"
    result = specpipe("bench", "-m", *base_args(setup, "proposer=ngram", "requests=4", "concurrency=1,2",
                                                 "plot=true", f"out={sweep}"))
    assert result.returncode == 0, result.stderr
    assert (sweep / "load_vs_concurrency.png").read_bytes().startswith(PNG)


def test_results_of_schema_1_still_read(setup, tmp_path):
    out = tmp_path / "run"
    assert specpipe("bench", *base_args(setup, "proposer=ngram", f"out={out}")).returncode == 0
    old = json.loads((out / "results.json").read_text())
    old["schema"] = "specpipe.bench/1"
    assert validate(old)["schema"] == "specpipe.bench/1"
    with pytest.raises(SpecpipeError, match="not a specpipe bench result"):
        validate({**old, "schema": "specpipe.bench/9"})


def test_a_request_load_refuses_per_prompt_peers(setup, tmp_path):
    result = specpipe("bench", *base_args(setup, "requests=4", "peer=hf-assisted", f"out={tmp_path}"))
    assert_user_error(result, "peer=hf-assisted", "request load", "hf-batched")


def test_the_warm_up_leaves_the_controller_as_it_found_it():
    """Warm-up steps pay kernel set-up: a guard judging them would pause the first measured
    requests. The controller comes out of the warm-up as it went in."""
    pipe = Pipeline(tiny_target(seed=0), NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), Guard(FixedGamma(3)))
    warm_up(pipe, [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [], 2, 0)
    assert pipe.controller._steps == 0 and pipe.controller.plain_cost(1) is None
    assert pipe.run([7, 8, 9, 10, 7, 8], max_new_tokens=8).stats.steps > 0 and pipe.controller._steps > 0


def test_transformers_plain_and_static_cache_peers_decode_what_the_target_does():
    """peer=hf-plain (transformers' plain `generate`) and peer=hf-static (its static cache, sized
    once as the runner's cache is; transformers compiles it on a GPU) answer as plain greedy
    decoding, prompt after prompt of different lengths, one static cache for all."""
    from specpipe.bench.peers import make_peers, peer_names

    target = tiny_target()
    pipe = Pipeline(target, None, GreedyVerifier(), None)
    peers = make_peers(peer_names(["hf-plain", "hf-static"], None), pipe, {})
    for prompt in ([5, 6, 7, 5, 6], [9, 3] * 9, [40]):
        want = pipe.run(prompt, max_new_tokens=12, speculative=False).token_ids
        runs = [peer.run(prompt, 12, 0) for peer in peers]
        assert [r.token_ids for r in runs] == [want, want] and all(r.tokens_per_s > 0 for r in runs)
    assert target.model._previous_max_cache_length == pipe.runner.cache.capacity


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_transformers_peers_run_on_cuda_beside_the_native_engine():
    """On a GPU the peers move transformers' model there (its own kernels, the runner's dtype)."""
    from specpipe.bench.peers import make_peers
    from specpipe.engine import make_runner

    target = tiny_target()
    pipe = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, device="cuda"))
    want = pipe.run([5, 6, 7, 5, 6], max_new_tokens=12, speculative=False).token_ids
    assert make_peers(["hf-plain"], pipe, {})[0].run([5, 6, 7, 5, 6], 12, 0).token_ids == want
    assert next(target.model.parameters()).device.type == "cuda"
