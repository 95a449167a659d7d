"""engine=llamacpp: the real SmolLM2 GGUF on llama.cpp's kernels under specpipe's pipeline.

The runner tests and the lossless tests need llama-cpp-python (`specpipe install llamacpp`) and
skip without it; the checks that refuse what cannot run there need neither. Greedy speculative
output must equal the same engine's plain output token for token where `probe_exact` measured
verify rows bitwise equal to one-token rows on this CPU for every block size the controller may
verify; elsewhere a divergence must be a near-tie, and every divergence is printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import PINNED
from specpipe.checks.llamacpp import check_llamacpp
from specpipe.commands.install import EXACT, PORTABLE, build_flags
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.exactness import first_divergence

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m"

needs_library = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True).returncode != 0,
    reason="llama-cpp-python is not installed (specpipe install llamacpp)")


# ---- the install flags and the checks (no library, no model) ------------------------------------

def test_install_picks_portable_flags_on_amx_and_keeps_the_users_own():
    flags, why = build_flags(("avx2", "avx512", "amx"), None)
    assert PORTABLE in flags and EXACT in flags and "AMX" in why
    assert build_flags(("avx2", "avx512"), None)[0] == EXACT  # native, with one kernel per row
    assert build_flags(("avx2", "amx"), "-DGGML_NATIVE=ON") == ("-DGGML_NATIVE=ON", "CMAKE_ARGS as set in the environment")


def test_install_refuses_an_unknown_target_with_exit_2():
    done = subprocess.run([sys.executable, "-m", "specpipe", "install", "vllm"], capture_output=True, text=True)
    assert done.returncode == 2 and "not an install command" in done.stderr and "Traceback" not in done.stderr


def test_install_prints_bracketed_flags_as_typed():
    env = dict(os.environ, CMAKE_ARGS="-DX=[/x]on")  # text in brackets is the user's, not markup
    done = subprocess.run([sys.executable, "-m", "specpipe", "install", "llamacpp", "--print"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0 and 'CMAKE_ARGS="-DX=[/x]on"' in done.stderr, done.stderr


def llamacpp_checks(overrides: list[str]):
    """The llama.cpp rows of `specpipe check` for these settings (models judged without fetching)."""
    from specpipe.settings import resolve

    cfg = compose(overrides)
    return check_llamacpp(cfg, resolve(cfg, fetch=False))


def test_a_missing_library_is_refused_with_how_to_install_it():
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "from specpipe.checks.llamacpp import check_llamacpp\n"
            "from specpipe.config import compose\n"
            "from specpipe.settings import resolve\n"
            "cfg = compose(['engine=llamacpp', 'proposer=ngram'])\n"
            "c = check_llamacpp(cfg, resolve(cfg, fetch=False))[0]\n"
            "print(c.status, '|', c.fix)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("refuse |") and "specpipe install llamacpp" in out


@needs_library
@pytest.mark.parametrize("overrides, words", [
    (["proposer=eagle3", "proposer.heads=/nonexistent"], "final norm"),
    (["proposer=twin"], "lower-bit GGUF"),
    (["proposer=ngram", "model.quantize=fp16"], "does not apply"),
    (["proposer=ngram", "device=cuda"], "on the CPU"),
    (["proposer=draft", "proposer.model=/tmp"], "not a GGUF"),
    (["proposer=ngram", "graphs=on"], "engine=native's static decode step"),
])
def test_what_cannot_run_on_llamacpp_is_refused_by_name(overrides, words):
    checks = llamacpp_checks(["engine=llamacpp", *overrides])
    refused = [c for c in checks if c.status == "refuse"]
    assert refused and any(words in c.why for c in refused), [c.why for c in checks]


@needs_library
def test_a_tree_is_drafted_as_its_best_path_with_a_warning_where_asked_for():
    asked = llamacpp_checks(["engine=llamacpp", "proposer=medusa", "proposer.heads=/nonexistent",
                             "proposer.tree=[[0],[1],[0,0]]"])
    assert [c.status for c in asked if c.name == "tree"] == ["warn"]
    default = llamacpp_checks(["engine=llamacpp", "proposer=suffix"])  # its own default: a tree where taken
    assert [(c.status, "best path" in c.why) for c in default if c.name == "tree"] == [("ok", True)]


def test_the_guarantee_counts_every_row_of_a_batch(monkeypatch, tmp_path):
    """A batch's evaluation is one block of all its rows' tokens for ggml's matmuls: exact only
    where rows × (γ + 1) is within what the probe measured."""
    from specpipe.checks import llamacpp

    monkeypatch.setattr(llamacpp, "measured_exact", lambda gguf, kernels: 16)
    alone, four, many = (llamacpp._guarantee(tmp_path, "exact", 5, rows) for rows in (1, 4, 16))
    assert alone.status == "ok" and "up to 5:" in alone.why
    assert four.status == "warn" and "5 tokens for each of 4 rows, 20 at once" in four.why and "γ ≤ 3" in four.fix
    assert many.status == "warn" and "fewer sequences" in many.fix  # γ = 1 would still be 32 at once


# ---- the real model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runner():
    from specpipe.engine.llamacpp import load_gguf_runner
    from specpipe.models.loader import resolve

    return load_gguf_runner(resolve("smollm2-135m"), cache_len=256)


def _singles(runner, context: list[int], tokens: list[int]) -> list[torch.Tensor]:
    runner.reset(0)
    runner.prefill(0, context)
    rows = []
    for token in tokens:
        rows.append(runner.forward(torch.tensor([[token]])).logits[0, 0])
        runner.commit([1])
    return rows


@pytest.mark.slow
@needs_library
def test_a_block_rolls_back_and_its_rows_match_one_token_steps(runner):
    from specpipe.engine.llamacpp import probe_exact

    context, tokens = [1, 4093, 198, 19161, 253, 1789], [10321, 2, 198, 1, 520, 9531, 198]
    singles = _singles(runner, context, tokens)
    runner.crop(0, len(context))  # roll back past every one-token step
    out = runner.forward(torch.tensor([tokens[:4]]))
    runner.commit([2])  # keep two: the next block starts at the third token
    assert runner.length == len(context) + 2
    rest = runner.forward(torch.tensor([tokens[2:]])).logits[0]
    rows = [*out.logits[0, :2], *rest]
    gap = max((a - b).abs().max().item() for a, b in zip(rows, singles))
    exact_up_to = probe_exact(runner, largest=8)  # the blocks of 4 and 5 above, and a few more
    print(f"llama.cpp verify rows against one-token rows: max |Δ logit| {gap:.3g}, exact blocks up to {exact_up_to}")
    assert gap == 0 or exact_up_to < 5  # blocks of 4 and 5 here: the probe measures what the pipeline relies on
    assert all(int(a.argmax()) == int(b.argmax()) for a, b in zip(rows, singles))


@pytest.mark.slow
@needs_library
def test_two_rows_in_one_block_equal_each_row_alone(runner):
    first, second = [1, 4093, 198, 19161, 253], [1, 9690, 198, 2683, 359, 253, 5356]
    alone = [_singles(runner, ids[:-2], ids[-2:]) for ids in (first, second)]
    runner.reserve(2)
    for row, ids in enumerate((first, second)):
        runner.reset(row)
        runner.prefill(row, ids[:-2])
    both = runner.forward(torch.tensor([first[-2:], second[-2:]])).logits  # [2, 2, V]
    for row in range(2):
        for i in range(2):
            assert int(both[row, i].argmax()) == int(alone[row][i].argmax())
            assert (both[row, i] - alone[row][i]).abs().max() < 1e-2


@pytest.mark.slow
@needs_library
def test_rows_decoded_together_through_rollbacks_equal_each_row_alone():
    """Each row has its own KV stream: in one unified cache a row's new cells filled the holes
    other rows' rollbacks left, and attention summed its cells in another order (~40% of rows
    differed). Blocks of 1, 2 and 4 tokens a row, a random number kept, three rows."""
    import random

    from specpipe.engine.llamacpp import load_gguf_runner
    from specpipe.models.loader import resolve

    source, rng = resolve("smollm2-135m"), random.Random(0)
    both = load_gguf_runner(source, cache_len=256, rows=3)
    alone = [load_gguf_runner(source, cache_len=256) for _ in range(3)]
    last = []
    for row, single in enumerate(alone):
        ids = [rng.randrange(10, 5000) for _ in range(rng.randrange(5, 60))]
        both.prefill(row, ids[:-1])
        single.prefill(0, ids[:-1])
        last.append(ids[-1])
    compared = 0
    for _ in range(40):
        n = rng.choice([1, 1, 2, 4])
        block = [[last[row]] + [rng.randrange(10, 5000) for _ in range(n - 1)] for row in range(3)]
        together = both.forward(torch.tensor(block)).logits  # [3, n, V]
        kept = [rng.randrange(1, n + 1) for _ in range(3)]
        both.commit(kept)
        for row, single in enumerate(alone):
            rows = single.forward(torch.tensor([block[row]])).logits[0]  # [n, V]
            single.commit([kept[row]])
            assert torch.equal(together[row], rows), (row, n)
            last[row] = int(rows[kept[row] - 1].argmax())
            compared += n
    assert compared > 150


@pytest.mark.slow
@needs_library
def test_the_final_norm_output_feeds_the_gguf_lm_head(runner):
    runner.reset(0)
    out = runner.prefill(0, [1, 4093, 198, 19161], hidden=(-1,))
    assert out.hidden[-1].shape == (1, 4, runner.hidden_size)
    mine = runner.lm_head(out.hidden[-1][0, -1])  # dequantized LM head over llama.cpp's features
    assert int(mine.argmax()) == int(out.logits[0, -1].argmax())
    assert torch.corrcoef(torch.stack([mine, out.logits[0, -1]]))[0, 1] > 0.999
    with pytest.raises(SpecpipeError, match="final norm"):
        runner.forward(torch.tensor([[198]]), hidden=(3,))


@pytest.fixture(scope="module")
def prompts():
    from specpipe.prompts import load_prompts

    return [p for p in load_prompts("dev") if p["id"] in {"code-01", "code-edit-01", "chat-01"}]


@pytest.mark.slow
@needs_library
@pytest.mark.parametrize("overrides", [
    ["proposer=ngram", "controller=fixed"],
    ["proposer=suffix", "controller=fixed"],
    pytest.param([f"recipe={RECIPES / 'eagle.yaml'}"], marks=pytest.mark.full),  # EAGLE heads (the final norm's
    # output) + lookup, confidence controller; full with Medusa: 18-21 s each, CI keeps lookup and the draft
    pytest.param([f"recipe={RECIPES / 'medusa.yaml'}"], marks=pytest.mark.full),
    ["proposer=draft", "proposer.model=smollm2-135m"],  # a GGUF draft on llama.cpp too (itself: all accepted)
])
def test_greedy_output_equals_plain_on_llamacpp(overrides, prompts):
    from specpipe.engine.llamacpp import probe_exact
    from specpipe.pipeline import Pipeline

    pipeline = Pipeline.from_config(compose(["engine=llamacpp", *overrides, "gamma=4", *PINNED]))
    assert pipeline.runner.engine == "llamacpp"
    widest = max(5, pipeline.controller.gamma_max + 1)  # every block it may verify
    exact = probe_exact(pipeline.runner, largest=widest) >= widest
    accepted = 0
    for prompt in prompts:
        ids = pipeline.encode(prompt["messages"])
        spec = pipeline.run(ids, max_new_tokens=48)
        plain = pipeline.run(ids, max_new_tokens=48, speculative=False)
        divergence = first_divergence(pipeline.runner, ids, spec.token_ids, plain.token_ids)
        if divergence is not None:
            print(f"{prompt['id']}: {divergence}")
        assert divergence is None or (not exact and divergence.near_tie), f"{prompt['id']}: {divergence}"
        assert len(plain.token_ids) > 0 and spec.stats.drafted > 0
        accepted += spec.stats.accepted
    assert accepted > 0


@pytest.mark.slow
@needs_library
def test_a_batch_of_requests_equals_each_alone_on_llamacpp(prompts):
    from specpipe.pipeline import Pipeline

    pipeline = Pipeline.from_config(compose(["engine=llamacpp", "proposer=ngram", "gamma=3", *PINNED]))
    ids = [pipeline.encode(p["messages"]) for p in prompts]
    together = pipeline.generate_batch(ids, max_new_tokens=32)
    for prompt, out in zip(ids, together):
        assert out.token_ids == pipeline.run(prompt, max_new_tokens=32, speculative=False).token_ids
    drafted, accepted = sum(out.stats.drafted for out in together), sum(out.stats.accepted for out in together)
    assert drafted > 0 and accepted > 0, (drafted, accepted)  # the batch really speculated


@pytest.mark.slow
@needs_library
def test_a_lower_bit_gguf_twin_drafts_losslessly(tmp_path, prompts):
    """proposer=twin on llama.cpp: the target's GGUF requantized to Q2_K by llama.cpp itself."""
    import llama_cpp

    from specpipe.models.loader import resolve
    from specpipe.pipeline import Pipeline

    source = resolve("smollm2-135m")
    twin = tmp_path / "smollm2-q2_k.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, True, 2
    assert llama_cpp.llama_model_quantize(str(Path(source.path) / source.gguf).encode(), str(twin).encode(),
                                          params) == 0
    pipeline = Pipeline.from_config(compose(["engine=llamacpp", "proposer=twin", f"proposer.gguf={twin}", "gamma=3",
                                             *PINNED]))
    ids = pipeline.encode(prompts[0]["messages"])
    spec = pipeline.run(ids, max_new_tokens=32)
    plain = pipeline.run(ids, max_new_tokens=32, speculative=False)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    assert spec.stats.accepted > 0  # the lower-bit copy agrees with the target on some tokens


def test_peer_auto_on_llamacpp_is_llama_cpp_itself():
    from specpipe.bench.peers import peer_names

    ngram, eagle = compose(["proposer=ngram"]).proposer, compose(["proposer=suffix"]).proposer
    assert peer_names("auto", ngram, "llamacpp") == ["llama-cpp", "llama-cpp-lookup"]
    assert peer_names("auto", eagle, "llamacpp") == ["llama-cpp"]
    assert peer_names("auto", ngram, "native") == ["hf-prompt-lookup"]
    assert peer_names(["llama-cpp"], ngram) == ["llama-cpp"]


@pytest.mark.slow
@needs_library
def test_the_llama_cpp_peers_decode_what_llama_cpp_decodes(prompts):
    """llama.cpp alone (its defaults) and its prompt lookup emit the same greedy tokens, and a
    decode-only rate."""
    from specpipe.bench.peers import make_peers
    from specpipe.pipeline import Pipeline

    cfg = compose(["engine=llamacpp", "proposer=ngram", "gamma=3"])
    pipeline = Pipeline.from_config(cfg)
    plain, lookup = make_peers(["llama-cpp", "llama-cpp-lookup"], pipeline, cfg)
    ids = pipeline.encode(prompts[0]["messages"])
    a, b = plain.run(ids, 24, 0), lookup.run(ids, 24, 0)
    assert len(a.token_ids) == 24 and a.tokens_per_s > 0 and b.tokens_per_s > 0
    assert a.token_ids == b.token_ids  # llama-cpp-python's own speculative decoding is lossless too
