"""End to end on the real SmolLM2-135M-Instruct (zoo; fetched once into the cache, ~100 MB).

Greedy speculative output must equal the plain target's on real prompts. A divergence fails
unless the target's own top-2 gap at that token is a near-tie (docs/concepts.md "Lossless in
practice"); every divergence is reported either way.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import BF16_TOLERANCE, PINNED, assert_tree_rows_equal_paths, feed
from specpipe.config import compose
from specpipe.exactness import first_divergence
from specpipe.pipeline import Pipeline
from specpipe.prompts import load_prompts


pytestmark = pytest.mark.slow  # the real SmolLM2 (zoo)


@pytest.fixture(scope="module")
def prompts():
    chosen = {"code-01", "code-edit-01", "chat-01"}
    return [p for p in load_prompts("dev") if p["id"] in chosen]


RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m"
SHIPPED = {  # the heads shipped in recipes/, as `specpipe generate recipe=...` runs them
    "eagle": [f"recipe={RECIPES / 'eagle.yaml'}"],
    "eagle-tree": [f"recipe={RECIPES / 'eagle.yaml'}", "proposer.tree={top_k: 3, nodes: 8}"],
    "medusa": [f"recipe={RECIPES / 'medusa.yaml'}"],
    "eagle3": [f"recipe={RECIPES / 'eagle3.yaml'}", "proposer.lookup=false"],  # the head alone (eagle: with lookup)
    "eagle3-shipped": [f"recipe={RECIPES / 'eagle3.yaml'}"],  # as shipped: its suffix lookup first
    "eagle3-tree": [f"recipe={RECIPES / 'eagle3.yaml'}", "proposer.tree={top_k: 3, nodes: 8}"],
    "eagle3-ngram": [f"recipe={RECIPES / 'eagle3.yaml'}", "proposer.lookup=ngram"],  # prompt lookup (the recipe: suffix)
}


_PLAIN: dict[tuple, list[int]] = {}  # the plain target's output, by what decides it (shared across proposers)


def greedy_equal_on(pipeline, prompts, tokens: int) -> int:
    """Each prompt decoded speculatively equals the plain target (a divergence only at a near-tie,
    reported); returns the draft tokens accepted over all of them."""
    accepted = 0
    runner = pipeline.runner
    for prompt in prompts:
        ids = pipeline.encode(prompt["messages"])
        spec = pipeline.run(ids, max_new_tokens=tokens)
        # plain steps run in the verify blocks' shape on static steps: the block is part of the key;
        # models of one family share a tokenizer, so the same ids: the model is too
        key = (pipeline.target.name, tuple(ids), tokens, runner.engine, runner.precision, runner.step,
               pipeline.widest_block())
        if key not in _PLAIN:
            _PLAIN[key] = pipeline.run(ids, max_new_tokens=tokens, speculative=False).token_ids
        plain = SimpleNamespace(token_ids=_PLAIN[key])
        divergence = first_divergence(pipeline.runner, ids, spec.token_ids, plain.token_ids)
        if divergence is not None:
            print(f"{prompt['id']}: {divergence}")
            assert divergence.near_tie, f"{prompt['id']}: {divergence}"
        else:
            assert spec.token_ids == plain.token_ids and len(plain.token_ids) > 0
        assert spec.stats.drafted > 0
        accepted += spec.stats.accepted
    return accepted


@pytest.mark.parametrize("proposer, controller", [("twin", "fixed"), ("ngram", "fixed"),
                                                  pytest.param("ngram", "cost", marks=pytest.mark.full),
                                                  ("suffix", "fixed"), ("eagle", None),
                                                  pytest.param("eagle-tree", None, marks=pytest.mark.full),
                                                  ("medusa", None), ("eagle3", None), ("eagle3-shipped", None),
                                                  # in CI through test_simulated_cuda's shipped recipes (tokens compared:
                                                  # the chain token for token, the tree up to a near-tie)
                                                  pytest.param("eagle3-ngram", None, marks=pytest.mark.full),
                                                  pytest.param("eagle3-tree", None, marks=pytest.mark.full)])
def test_smollm2_greedy_equals_plain(proposer, controller, prompts):
    overrides = SHIPPED.get(proposer) or [f"proposer={proposer}", f"controller={controller}"]
    pipeline = Pipeline.from_config(compose([*overrides, "gamma=4", *PINNED]))
    accepted = greedy_equal_on(pipeline, prompts, 48)
    assert accepted > 0 or proposer not in SHIPPED  # trained heads guess some of the target's tokens


def test_chat_template_is_applied():
    pipeline = Pipeline.from_config(compose(["proposer=none"]))
    ids = pipeline.encode("Hello")
    text = pipeline.target.tokenizer.decode(ids)
    assert "<|im_start|>user\nHello<|im_end|>" in text and text.rstrip().endswith("<|im_start|>assistant")
    raw = Pipeline.from_config(compose(["proposer=none", "model.chat=false"])).encode("Hello")
    assert raw == pipeline.target.tokenizer("Hello", add_special_tokens=False)["input_ids"] and len(raw) < len(ids)


@pytest.mark.full  # 52 s; bench, tune and export run on tiny models and the README examples in CI
def test_smollm2_bench_tune_and_export(tmp_path):
    """The real model through bench (with transformers' prompt lookup as a peer), tune and export."""
    from specpipe.bench.results import read_results
    from specpipe.recipe import load_recipe
    from test_cli import specpipe

    common = ["prompts=dev", "categories=[code-edit]", "limit=1", "max_new_tokens=24", "warmup=0"]
    bench = specpipe("bench", "proposer=ngram", "peer=hf-prompt-lookup", f"out={tmp_path / 'bench'}", *common)
    assert bench.returncode == 0, bench.stderr
    overall = read_results(tmp_path / "bench" / "results.json")["summary"]["overall"]
    assert overall["exactness"]["share"] == 1.0 and overall["acceptance_rate"] > 0
    assert overall["peers"]["hf-prompt-lookup"]["exactness"]["share"] == 1.0

    tune = specpipe("tune", "strategies=[ngram]", "gammas=[4]", f"out={tmp_path / 'recipes'}",
                    f"work={tmp_path / 'work'}", *common)
    assert tune.returncode == 0, tune.stderr
    recipe = load_recipe(tmp_path / "recipes" / "smollm2-135m")
    assert recipe.target == "smollm2-135m" and "ngram-g4" in recipe.measured["choose_on"]["speedup"]
    assert recipe.measured["report_on"]["set"] == "held-aside" and "ngram-g4" in recipe.measured["report_on"]["speedup"]
    export = specpipe("export", "vllm", f"recipe={recipe.path}", f"out={tmp_path / 'spec.json'}")
    assert export.returncode == 0 and "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct" in export.stdout


@pytest.mark.parametrize("precision", ["w8a16", pytest.param("bf16", marks=BF16_TOLERANCE)])
def test_smollm2_exact_precision_rows_are_bitwise(precision):
    """The exact precisions: every row of a 2-, 5- and 9-token block (and a 16-node tree's
    size) is bitwise equal to one-token forwards, on the real model (bf16 on AMX CPUs needs its
    fixed-size blocks: oneDNN sums a 1-row call in another order), and every row of a 12-node
    tree equals one-token forwards along its path."""
    from specpipe.models.quantize import has_amx

    pipeline = Pipeline.from_config(compose(["proposer=none", f"model.quantize={precision}"]))
    runner = pipeline.runner
    assert runner.engine == "native"
    context = pipeline.encode("Write a function that reverses a linked list.")
    block = pipeline.target.tokenizer("def reverse(head):\n    prev = None\n    while head:\n")["input_ids"][:17]
    runner.reset()
    feed(runner, context)
    singles = [feed(runner, [token]).logits[0, 0] for token in block]
    # a block as long as a 16-node tree's: measured with AMX (fixed blocks); the AVX2 figures reach 9
    for k in (2, 5, 9, len(block)) if has_amx() else (2, 5, 9):
        runner.crop(0, len(context))
        rows = feed(runner, block[:k]).logits[0]
        for i in range(k):
            assert torch.equal(rows[i], singles[i]), (k, i)
    assert_tree_rows_equal_paths(runner, context, block)


EXACT_SETS = {"ngram": ["proposer=ngram"], "twin": ["proposer=twin"], "eagle": SHIPPED["eagle"],
              "eagle-tree": SHIPPED["eagle-tree"], "medusa": SHIPPED["medusa"]}


def bit_for_bit(proposer: str, prompts, tokens: int) -> None:
    """On the exact precision no near-tie excuse is needed: every prompt's output identical, with
    drafts proposed and kept."""
    pipeline = Pipeline.from_config(compose([*EXACT_SETS[proposer], "model.quantize=w8a16", "gamma=4", *PINNED]))
    drafted = accepted = 0
    for prompt in prompts:
        ids = pipeline.encode(prompt["messages"])
        spec = pipeline.run(ids, max_new_tokens=tokens)
        plain = pipeline.run(ids, max_new_tokens=tokens, speculative=False)
        assert spec.token_ids == plain.token_ids, prompt["id"]
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert drafted > 0 and accepted > 0, (drafted, accepted)


@pytest.mark.parametrize("proposer", EXACT_SETS)
def test_smollm2_exact_speculative_output_is_plain_bit_for_bit_in_brief(proposer, prompts):
    """The bitwise set in CI's time: every proposer, 3 dev prompts, 16 tokens each."""
    bit_for_bit(proposer, prompts, 16)


@pytest.mark.full  # bitwise on the real model, every proposer, at length: `pytest -m full`
@pytest.mark.parametrize("proposer", EXACT_SETS)
def test_smollm2_exact_speculative_output_is_plain_bit_for_bit(proposer):
    """10 dev prompts, 24 tokens each."""
    bit_for_bit(proposer, load_prompts("dev")[:10], 24)


def test_smollm2_overlapped_plain_decoding_is_the_sequential_loop(prompts):
    """`overlap=on` (each plain step queued before the last is read, as on a GPU) on the real
    model's static bf16 steps: every request's tokens and text as the sequential loop gives them,
    two at a time, rows stopping at different steps and the third request taking a freed slot."""
    from specpipe.decode.loop import Request

    runs = {}
    for overlap in ("on", "off"):
        pipeline = Pipeline.from_config(compose(["proposer=none", "model.quantize=bf16", "graphs=on",
                                                 f"overlap={overlap}"]))
        requests = [Request(pipeline.encode(prompt["messages"]), budget)
                    for prompt, budget in zip(prompts, (20, 7, 13))]
        out = {i: ([], "") for i in range(len(requests))}
        for event in pipeline.serve(requests, concurrency=2, speculative=False):
            tokens, text = out[event.index]
            out[event.index] = (tokens + event.tokens, text + event.text)
        runs[overlap] = out
    assert runs["on"] == runs["off"] and [len(tokens) for tokens, _ in runs["on"].values()] == [20, 7, 13]


def test_smollm2_lookups_that_keep_missing_are_queued_ahead_and_exact(prompts, monkeypatch):
    """Prompt lookup of 64-grams (none recurs in these answers) with `overlap=on` on the real
    model, under scripted step timings in which a step read before the next is queued costs 0.3
    of a plain step more (test_overlap.HostClock): the guard pauses the rows whose lookups keep
    missing and their held steps are queued ahead; every request is still the plain target's
    output, two at a time."""
    from test_overlap import HostClock

    from specpipe.decode.loop import Decoder, Request

    monkeypatch.setattr("specpipe.decode.step.Clock", HostClock)
    pipeline = Pipeline.from_config(compose(["proposer=ngram", "proposer.ngram_max=64", "proposer.ngram_min=64", "gamma=4",
                                               "overlap=on"]))
    requests = [Request(pipeline.encode(prompt["messages"]), budget) for prompt, budget in zip(prompts, (40, 24, 32))]
    alone = [pipeline.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in requests]
    decoder = Decoder(pipeline, 2)
    launch, queued = decoder._launch, []

    def launched(busy, pending=None):
        HostClock.queued = pending is not None
        queued.append(HostClock.queued)
        return launch(busy, pending)

    decoder._launch = launched
    out = {i: [] for i in range(len(requests))}
    for event in decoder.run(requests):
        out[event.index] += event.tokens
    assert [out[i] for i in range(len(requests))] == alone
    assert sum(queued) > len(queued) // 2, queued


def test_streamed_text_equals_the_whole_decode():
    """Incremental detokenization (a window per step) gives exactly the text of decoding it all,
    multi-byte characters split across steps included."""
    import random

    from specpipe.models.loader import load_tokenizer, resolve
    from specpipe.pipeline import TextStream

    tokenizer = load_tokenizer(resolve("smollm2-135m"))
    ids = tokenizer("Héllo wörld, 你好世界! 🙂 def f(x):\n    return x ** 2  # ünïcode ✓\n" * 3)["input_ids"]
    rng = random.Random(0)
    for _ in range(20):
        stream, text, i = TextStream(tokenizer), "", 0
        while i < len(ids):
            n = rng.randint(1, 5)
            text += stream.push(ids[i : i + n], final=i + n >= len(ids))
            i += n
        assert text == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("proposer", [  # the EAGLE head in CI (tiny models test every proposer: test_batch.py)
    pytest.param(name, marks=pytest.mark.full) if name != "eagle" else name
    for name in ("plain", "ngram", "twin", "eagle", "medusa")])
def test_smollm2_exact_batched_rows_equal_each_prompt_alone(proposer):
    """Batch > 1 on the exact precision: 6 dev prompts of different lengths, 4 slots (so two
    join a running batch), each row bitwise the prompt decoded alone; rows end at different steps."""
    from specpipe.pipeline import Request

    settings = {"plain": ["proposer=none"], **EXACT_SETS}[proposer]
    pipeline = Pipeline.from_config(compose([*settings, "model.quantize=w8a16", "gamma=4", *PINNED]))
    speculative = proposer != "plain"
    ids = [pipeline.encode(p["messages"]) for p in load_prompts("dev")[:6]]
    lengths = [24, 9, 17, 24, 5, 12]
    alone = [pipeline.run(i, max_new_tokens=n, speculative=speculative).token_ids for i, n in zip(ids, lengths)]
    batched: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    drafted = accepted = 0
    for event in pipeline.serve([Request(i, n) for i, n in zip(ids, lengths)], concurrency=4,
                                speculative=speculative):
        batched[event.index].extend(event.tokens)
        if event.finish_reason is not None:
            drafted, accepted = drafted + event.stats.drafted, accepted + event.stats.accepted
    assert [batched[i] for i in range(len(ids))] == alone
    assert not speculative or (drafted > 0 and accepted > 0), (drafted, accepted)


@pytest.mark.full  # loads Qwen2.5-Coder-0.5B (~1 GB fetched once) beside SmolLM2
def test_a_draft_with_another_tokenizer_keeps_the_real_targets_output(prompts):
    """SmolLM2-135M drafting for Qwen2.5-Coder-0.5B: another family, re-tokenised drafts. The
    guard is off: on a CPU where the drafts do not pay it pauses them, and this test is about
    what they keep."""
    pipeline = Pipeline.from_config(compose(["model=qwen2.5-coder-0.5b", "proposer=draft",
                                             "proposer.model=smollm2-135m", "gamma=4", "guard=false"]))
    assert type(pipeline.proposer).__name__ == "CrossDrafter"
    assert greedy_equal_on(pipeline, prompts, 32) > 0  # the translated drafts are kept some of the time


@pytest.mark.full  # loads Qwen2.5-Coder-1.5B (~1.1 GB fetched once, ~3.4 GB in memory)
def test_the_shipped_qwen_head_keeps_the_real_targets_output(prompts):
    """The EAGLE-3 head shipped for Qwen2.5-Coder-1.5B, as its recipe runs it (prompt lookup
    first) and alone: the real 1.5B target's greedy output either way."""
    recipe = RECIPES.parent / "qwen2.5-coder-1.5b" / "eagle3.yaml"
    for extra in ([], ["proposer.lookup=false", "controller=fixed", "gamma=4"]):
        pipeline = Pipeline.from_config(compose(["model=qwen2.5-coder-1.5b", f"recipe={recipe}", *extra]))
        assert greedy_equal_on(pipeline, prompts, 32) > 0  # the head (or lookup) is right some of the time


@pytest.mark.full  # loads Qwen2.5-Coder-1.5B (~1.1 GB fetched once, ~3.4 GB in memory)
@BF16_TOLERANCE
def test_the_shipped_qwen_head_is_bitwise_lossless_in_bf16(prompts):
    """Where bf16's kernel split was found (oneDNN on AMX, K = 8960): the 1.5B's rows of 2- to
    16-token blocks equal one-token forwards bitwise, and the shipped head with its recipe, on
    the exact precision, gives the plain output token for token with no near-tie excuse."""
    recipe = RECIPES.parent / "qwen2.5-coder-1.5b" / "eagle3.yaml"
    pipeline = Pipeline.from_config(compose(["model=qwen2.5-coder-1.5b", f"recipe={recipe}", "model.quantize=bf16"]))
    runner = pipeline.runner
    context = pipeline.encode("Write a function that reverses a linked list.")
    block = pipeline.target.tokenizer("def reverse(head):\n    prev = None\n    while head:\n")["input_ids"][:16]
    runner.reset()
    feed(runner, context)
    singles = torch.cat([feed(runner, [token]).logits[0] for token in block])  # [16, V]
    for k in (2, 5, 9, len(block)):
        runner.crop(0, len(context))
        assert torch.equal(feed(runner, block[:k]).logits[0], singles[:k]), k
    for prompt in prompts[:3]:
        ids = pipeline.encode(prompt["messages"])
        want = pipeline.run(ids, max_new_tokens=32, speculative=False).token_ids
        assert pipeline.run(ids, max_new_tokens=32).token_ids == want


# ---- Gemma 3 270M (zoo): a family other than Llama's on real weights ------------------------------

GEMMA = "gemma3-270m"
GEMMA_PROMPTS = [  # raw text (a base model), the last past the sliding layers' 512-token window
    "The capital of France is",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n" * 2 + "def fact(n):\n",
    "\n".join(f"{i} squared is {i * i}." for i in range(1, 56)),
]


@pytest.fixture(scope="module")
def gemma():
    """Gemma 3 270M as fetched by `specpipe models fetch gemma3-270m` (~250 MB; never fetched
    here), loaded in float32 through the zoo's loader (its dense copy built on first load)."""
    from specpipe.models import zoo
    from specpipe.models.loader import load

    if zoo.cached_gguf(GEMMA) is None:
        pytest.skip(f"{GEMMA} is not cached (specpipe models fetch {GEMMA})")
    return load(GEMMA)


def test_gemma3_native_greedy_equals_transformers_and_speculation_equals_plain(gemma):
    """The native forward (fp32) decodes the real Gemma 3 270M token for token as transformers'
    own generate does, a prompt past the sliding window included; greedy n-gram speculation on it
    emits plain decoding's tokens, with drafts kept."""
    from specpipe.controllers.fixed import FixedGamma
    from specpipe.engine import make_runner
    from specpipe.proposers.ngram import NgramProposer
    from specpipe.sampling import SamplingParams
    from specpipe.verifiers.greedy import GreedyVerifier

    runner = make_runner(gemma.model, engine="native", cache_len=1024)
    assert (runner.engine, runner.precision, runner.lm.spec.family.norm_offset) == ("native", "none", 1.0)
    assert {w for w in runner.lm.spec.windows} == {512, None}  # sliding and global layers
    pipe = Pipeline(gemma, NgramProposer(ngram_min=1), GreedyVerifier(), FixedGamma(3), sampling=SamplingParams(),
                    chat=False, runner=runner)
    accepted = 0
    for text in GEMMA_PROMPTS:
        ids = gemma.tokenizer(text)["input_ids"]
        with torch.no_grad():
            want = gemma.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20)[0, len(ids):].tolist()
        plain = pipe.run(ids, max_new_tokens=20, speculative=False).token_ids
        assert plain == want, (text[:30], plain, want)
        spec = pipe.run(ids, max_new_tokens=20)
        assert spec.token_ids == plain, text[:30]
        accepted += spec.stats.accepted
    assert len(gemma.tokenizer(GEMMA_PROMPTS[-1])["input_ids"]) > 512 and accepted > 0
