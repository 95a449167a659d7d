"""The native engine's static step (`graphs=on`, engine/static.py): decode forwards in a few fixed
shapes over persistent buffers, attention over the whole cache with lengths on the device.

On the CPU the static code runs eagerly (no capture), so its logic is tested here; the `cuda`
cases run the same tests with CUDA graphs captured and replayed (benchmarks/gpu_check.sh runs
them). What is checked: the static step computes what the eager forward does (chains, trees,
ragged batches, hidden states); `kernels=exact` makes every verify row bitwise its plain step's
row, in float32 too, whatever the precision; greedy speculative output equals plain decoding;
a generation runs a fixed set of shapes (graphs), and a second one adds none. The drafts graphed
beside it (a draft model's static step, Medusa's heads, EAGLE chains and tree searches) draft
what their eager code drafts, and no graphed computation reads the host.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, TREE_PARENTS, feed, tiny_model, tiny_target
from specpipe.controllers.confidence import ConfidenceGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.guard import guarded
from specpipe.controllers.heuristic import HeuristicGamma
from specpipe.decode.loop import Decoder
from specpipe.decode.syncs import capture_hazards, host_reads, reads_per_step
from specpipe.engine import FINAL, make_runner
from specpipe.engine.static import WIDTH_MIN, Shape
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline, Request
from specpipe.proposers.eagle import TreeShape
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from test_cli import model_dirs  # noqa: F401  (a fixture)
from test_engine import tiny_qwen
from test_medusa import random_heads

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]
KERNELS = ["exact", "fast"]
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
GREEDY = SamplingParams()


def static(model, device="cpu", kernels="exact", block=5, **options):
    runner = make_runner(model, engine="native", device=device, graphs="on", kernels=kernels, **options)
    runner.plan(block)
    return runner


def close(device):
    """Exact on the CPU in float64; a GPU's float64 kernels may reduce in another order."""
    return dict(rtol=0, atol=1e-10) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_static_rows_equal_the_eager_forward(family, kernels, device):
    """Prefill (eager), then steps of 1-5 tokens and a rollback: logits and hidden states as the
    eager forward's (float64: equal to ~1e-15)."""
    model = tiny_model(0) if family == "llama" else tiny_qwen(0)
    eager, fixed = make_runner(model, engine="native", device=device, graphs="off"), static(model, device, kernels)
    assert (eager.step, fixed.step.split(" + ")[0]) == ("eager", f"static {kernels}")
    for ids in (PROMPT, [3], [4, 5, 6], [7, 8, 9, 10, 11], [1], [2, 2]):
        want, got = feed(eager, ids, hidden=(0, FINAL)), feed(fixed, ids, hidden=(0, FINAL))
        torch.testing.assert_close(got.logits, want.logits, **close(device))
        torch.testing.assert_close(got.hidden[FINAL], want.hidden[FINAL], **close(device))
        torch.testing.assert_close(got.hidden[0], want.hidden[0], **close(device))
        eager.crop(0, eager.length - 1), fixed.crop(0, fixed.length - 1)  # a rejected last token
    assert fixed.lengths[0] == eager.lengths[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernels", KERNELS)
def test_static_batch_rows_are_independent_and_ragged(kernels, device):
    """Three ragged rows in a bucket of four: each row equals that sequence alone (eager)."""
    model = tiny_qwen(1)
    runner = static(model, device, kernels, block=3)
    runner.reserve(3)
    assert runner.rows == 4  # the bucket
    prefixes = [[5, 17, 33, 2, 9, 41], [7, 8, 9, 10], [60, 1]]
    for row, ids in enumerate(prefixes):
        runner.prefill(row, ids)
    new = torch.tensor([[20, 21, 22], [30, 31, 32], [40, 41, 42]]).to(runner.device)
    out = runner.forward(new, hidden=(FINAL,))
    assert runner.lengths[:3] == [9, 7, 5]
    for row in range(3):
        alone = make_runner(model, engine="native", device=device, graphs="off")
        want = feed(alone, prefixes[row] + new[row].tolist(), hidden=(FINAL,))
        torch.testing.assert_close(out.logits[row], want.logits[0, -3:], **close(device))
        torch.testing.assert_close(out.hidden[FINAL][row], want.hidden[FINAL][0, -3:], **close(device))


@pytest.mark.parametrize("device", DEVICES)
def test_fast_static_tree_rows_equal_their_paths(device):
    """A tree block (kernels=fast takes trees) through the static step: every row equals the
    eager one-token forwards along its path."""
    from specpipe.drafts import block_ancestry

    model, tokens = tiny_model(0), list(range(30, 30 + len(TREE_PARENTS)))
    runner, eager = static(model, device, "fast", block=len(TREE_PARENTS) + 1), make_runner(model, graphs="off")
    assert runner.trees
    feed(runner, PROMPT[:-1])
    rows = feed(runner, [PROMPT[-1], *tokens], tree=TREE_PARENTS).logits[0]
    ancestry = block_ancestry(torch.tensor([TREE_PARENTS]))[0]
    for node in range(len(TREE_PARENTS) + 1):  # row 0: the last prompt token; row i: node i - 1
        path = [tokens[i - 1] for i in range(1, node + 1) if ancestry[node, i]]
        eager.reset()
        want = feed(eager, PROMPT + path).logits[0, -1]
        torch.testing.assert_close(rows[node].cpu(), want, rtol=0, atol=1e-10 if device == "cpu" else 1e-6)
    assert any(shape.tree for shape in runner.static.shapes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [5, 9])
@pytest.mark.parametrize("precision", ["none", "fp16", "bf16", "w8a16"])
def test_exact_static_rows_are_bitwise_plain_steps_in_float32(precision, block, device):
    """kernels=exact, float32 model: every row of a 2..K-token block is bitwise the padded
    one-token step at that position, alone and in a batch. K = 5 and 9 are row counts for which
    a 2-core CPU's fp32 GEMM computed the last row differently from the others (MKL, two
    threads), so a verify row would differ from a plain row at another index: the ring (each
    token at the block row of its position) is what makes them equal."""
    if device == "cuda" and precision in ("fp16", "w8a16"):
        pytest.skip("a CPU-only kernel")
    model = tiny_model(0, dtype=torch.float32)
    runner = static(model, device, kernels="exact", block=block, precision=precision)
    draft = list(range(20, 20 + block))
    feed(runner, PROMPT)
    singles = torch.cat([feed(runner, [t]).logits[0] for t in draft])  # [K, V]
    for k in range(2, block + 1):
        runner.crop(0, len(PROMPT))
        assert torch.equal(feed(runner, draft[:k]).logits[0], singles[:k]), k
    assert runner.static.shapes == {Shape(1, block, False, (), None, WIDTH_MIN)}  # a short sequence's width
    batch = static(model, device, kernels="exact", block=block, precision=precision)
    batch.reserve(3)  # three rows in a bucket of four
    prompts = [PROMPT, [3, 60, 22], [9, 9, 8, 7, 6, 5, 4, 3, 2, 1]]
    for row, ids in enumerate(prompts):
        batch.prefill(row, ids)
    steps = [batch.forward(torch.tensor([[t + row] for row in range(3)]).to(batch.device)).logits
             for t in draft[:3]]  # plain steps
    for row, ids in enumerate(prompts):
        batch.crop(row, len(ids))
    verify = batch.forward(torch.tensor([[t + row for t in draft[:3]] for row in range(3)]).to(batch.device)).logits
    assert torch.equal(verify, torch.cat(steps, 1))


def long_model(dtype=torch.float64):
    """The tiny Llama with room for 1,024 positions: a cache wide enough for several attention widths."""
    model = tiny_model(0, dtype=dtype)
    model.config.max_position_embeddings = 1024
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["none", "bf16"])
def test_static_rows_do_not_depend_on_the_attention_width(precision, device):
    """A static step attends over the narrowest width (256, 512, ... slots, or the whole
    allocation) that holds what its rows' requests may hold (`Runner.expect`), so a short request
    reads no slot a long one needs. The keys past a row's position are masked at any width, so
    every width computes the same rows bitwise, one row or a ragged batch (kernels=exact's
    construction holds whichever width a plain step or a verify block runs at: a batch's width
    follows the longest request in it, which changes as requests come and go)."""
    runner = static(long_model(torch.float32), device, kernels="exact", block=5, precision=precision)
    assert runner.cache.width == 1088  # 1,024 slots and the padding rows' spare, aligned
    runner.reserve(3)
    prompts = [PROMPT, [3, 60, 22], [9, 9, 8, 7, 6, 5, 4, 3, 2, 1]]
    block = torch.tensor([[20 + row, 21, 22, 23, 24] for row in range(3)]).to(runner.device)
    rows = {}
    for batch in (1, 3):
        for expected in (0, 300, 700, 1024):
            runner.reset()
            for row in range(batch):
                runner.expect(row, expected)
                runner.prefill(row, prompts[row])
            rows[batch, expected] = runner.forward(block[:batch], hidden=(FINAL,))
    assert {shape.width for shape in runner.static.shapes} == {256, 512, 1024}
    for (batch, expected), out in rows.items():
        assert torch.equal(out.logits, rows[batch, 0].logits), (batch, expected)
        assert torch.equal(out.hidden[FINAL], rows[batch, 0].hidden[FINAL]), (batch, expected)
        assert torch.equal(out.logits[0], rows[1, 0].logits[0]), (batch, expected)  # row 0 alone or beside others


@pytest.mark.parametrize("device", DEVICES)
def test_each_request_attends_over_its_own_width(device):
    """Through the decode loop: a short request's steps attend over 256 slots, a long one's over
    512, each at one width from its first step to its last, and the greedy output is the eager
    plain decoding's. On a GPU a width is captured at the first step that runs at it, and a
    second generation captures nothing."""
    model = long_model()
    target = LoadedModel("tiny", model, tiny_target().tokenizer)
    long = [(7 * i) % 60 + 2 for i in range(300)]
    prompts = [PROMPT, long]
    eager = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(model, graphs="off", cache_len=1024))
    want = [eager.run(p, max_new_tokens=20, speculative=False).token_ids for p in prompts]
    pipe = Pipeline(target, NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), FixedGamma(4),
                    runner=make_runner(model, device=device, graphs="on", cache_len=1024))
    static = pipe.runner.static
    widths = []
    for prompt in prompts:
        static.shapes.clear()
        assert pipe.run(prompt, max_new_tokens=20).token_ids == want[len(widths)]
        widths.append({shape.width for shape in static.shapes})
    assert widths == [{256}, {512}]
    captures = static.captures
    assert captures == (2 if device == "cuda" else 0)  # kernels=exact: one shape, at two widths
    assert [pipe.run(p, max_new_tokens=20).token_ids for p in prompts] == want
    assert static.captures == captures


def pipelines(kernels: str, proposer, controller, device="cpu"):
    target = tiny_target(seed=0)
    runner = make_runner(target.model, engine="native", device=device, graphs="on", kernels=kernels)
    return Pipeline(target, proposer, GreedyVerifier(), controller, runner=runner), target


PROPOSERS = {
    "ngram": lambda device: (NgramProposer(ngram_max=3, ngram_min=1), FixedGamma(4)),
    "ngram-adaptive": lambda device: (NgramProposer(ngram_max=3, ngram_min=1), HeuristicGamma(2, 1, 6)),
    "draft": lambda device: (ModelDrafter(tiny_model(seed=7, layers=1), GREEDY, device=device), FixedGamma(3)),
    "medusa": lambda device: (MedusaProposer(random_heads(seed=1), GREEDY), FixedGamma(3)),
    "medusa-tree": lambda device: (MedusaProposer(random_heads(seed=1), GREEDY, tree=[[0], [1], [0, 0], [0, 1]]),
                                   FixedGamma(3)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_static_output_equals_plain_decoding(proposer, kernels, device):
    """Chains (fixed and adaptive γ, a draft model, Medusa heads), a tree (exact: its best path),
    one sequence and a batch: the speculative output is the plain output of the same pipeline,
    and both are the eager engine's plain output."""
    pipe, target = pipelines(kernels, *PROPOSERS[proposer](device), device=device)
    eager = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, graphs="off"))
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    want = [eager.run(p, max_new_tokens=20, speculative=False).token_ids for p in prompts]
    runs = [pipe.run(p, max_new_tokens=20) for p in prompts]
    assert [r.token_ids for r in runs] == want
    assert sum(r.stats.drafted for r in runs) > 0
    assert [pipe.run(p, max_new_tokens=20, speculative=False).token_ids for p in prompts] == want
    if not proposer.endswith("tree"):
        assert [o.token_ids for o in pipe.generate_batch(prompts, max_new_tokens=20)] == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernels", KERNELS)
def test_generations_run_only_planned_shapes_captured_once(kernels, device):
    """The shapes a pipeline's forwards may run are fixed by its plan before it decodes; every
    forward of its generations runs one of them (kernels=exact: ONE, plain steps and verify
    blocks alike), and on a GPU all are captured at the first forward and never again."""
    pipe, _ = pipelines(kernels, *PROPOSERS["ngram-adaptive"](device), device=device)
    pipe.runner.reserve(3)
    static = pipe.runner.static
    planned = set(static.planned((), "greedy", WIDTH_MIN))  # chains verified inside the graph; short requests
    widest = 1 + 6  # the heuristic controller's gamma_max
    if kernels == "exact":
        assert planned == {Shape(4, widest, False, (), "greedy", WIDTH_MIN)}  # the bucket of the cache's rows, K
    else:
        assert planned == {Shape(b, k, False, (), "greedy", WIDTH_MIN)
                           for b in (1, 2, 4) for k in (1, 2, 4, widest)} | {
            Shape(1, k, True, (), None, WIDTH_MIN) for k in (2, 4, widest)}
    pipe.generate_batch([REPEATING, PROMPT, [3, 60, 22]], max_new_tokens=16)
    captures = static.captures
    assert captures == (len(planned) if device == "cuda" else 0)
    for prompt in ([5, 5, 6, 5, 5, 6, 5], [11, 12, 13, 11, 12, 13, 11, 12]):
        pipe.run(prompt, max_new_tokens=24)
        pipe.run(prompt, max_new_tokens=24, speculative=False)
    pipe.generate_batch([PROMPT, REPEATING, [40, 41]], max_new_tokens=12)
    assert static.captures == captures and static.shapes <= planned
    assert len(static.shapes) == 1 if kernels == "exact" else len(static.shapes) > 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_draft_model_steps_in_planned_shapes_captured_once(device):
    """A draft model's steps run its own static step (graphs=on here; auto on a GPU) with the
    fewest rows: blocks of 1 and 2 tokens (its first forward feeds the last token, or, where
    every draft was kept, the last draft token and the bonus), each forward one of the planned
    shapes, captured once."""
    target = tiny_target(seed=0)
    draft = ModelDrafter(tiny_model(seed=0), GREEDY, device=device, graphs="on")  # the target's twin: all kept
    pipe = Pipeline(target, draft, GreedyVerifier(), FixedGamma(3),
                    runner=make_runner(target.model, device=device, graphs="on"))
    static = draft.runner.static
    assert (static.exact, static.blocks()) == (False, [1, 2])
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    eager = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, graphs="off"))
    want = [eager.run(p, max_new_tokens=16, speculative=False).token_ids for p in prompts]
    assert [o.token_ids for o in pipe.generate_batch(prompts, max_new_tokens=16)] == want
    captures, planned = static.captures, set(static.planned((), "greedy pick", WIDTH_MIN))  # the pick inside the graphs
    assert captures == (len(planned) if device == "cuda" else 0)
    runs = [pipe.run(p, max_new_tokens=16) for p in prompts]
    assert [r.token_ids for r in runs] == want and sum(r.stats.accepted for r in runs) > 0
    assert static.captures == captures and {s.block for s in static.shapes} == {1, 2} and static.shapes <= planned


def test_a_draft_takes_the_static_step_only_on_the_native_engine():
    """graphs=on reaches a draft only where the native engine runs it (an int8 twin included);
    a draft on the hf engine stays eager instead of refusing the pipeline's setting."""
    target = tiny_target(seed=0)
    want = Pipeline(target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=12, speculative=False).token_ids
    for precision, engine, step in (("int8", "auto", "static fast"), ("none", "hf", "eager")):
        draft = ModelDrafter(tiny_model(seed=0, dtype=torch.float32), GREEDY, precision=precision, engine=engine,
                             graphs="on")
        pipe = Pipeline(target, draft, GreedyVerifier(), FixedGamma(3), runner=make_runner(target.model, graphs="on"))
        run = pipe.run(PROMPT, max_new_tokens=12)
        assert (draft.runner.step, run.token_ids) == (step, want) and run.stats.accepted > 0


def eagle_heads(tree=None, sampling=GREEDY):
    """An EAGLE head and an EAGLE-3 head (drafting from the even ids) over `target4`'s shape,
    drafting chains, or EAGLE-2 trees of shape `tree`."""
    from specpipe.proposers.eagle import EagleProposer
    from specpipe.proposers.eagle3 import proposer_for
    from test_eagle import copy_head
    from test_eagle3 import random_head as eagle3_head

    return {"eagle": lambda: EagleProposer(copy_head(), sampling, tree),
            "eagle3": lambda: proposer_for(eagle3_head(1, torch.arange(0, 64, 2)), sampling, tree)}


def recording(pipe: Pipeline) -> list:
    """Each step's draft, from now on: per row the tokens counted, and a tree's parents."""
    propose, log = pipe.proposer.propose, []

    def recorded(rows, gammas):
        draft = propose(rows, gammas)
        log.append(([draft.tokens[b, :n].tolist() for b, n in enumerate(draft.num_draft.tolist())]
                    if draft.tree is None else draft.tokens.tolist(), None if draft.tree is None else draft.tree.tolist()))
        return draft

    pipe.proposer.propose = recorded
    return log


@pytest.mark.parametrize("gamma", [2, 3])
def test_graphed_medusa_heads_pick_what_the_eager_heads_pick(gamma):
    """Where the target's steps are graphed, Medusa's greedy picks run inside its heads' graph
    and its chain is that graph's output as it is: step for step the same drafts as the eager
    heads (all heads, and fewer than all), one sequence or a batch, and plain decoding's output."""
    target = tiny_target(seed=0)
    pipes = [Pipeline(target, MedusaProposer(random_heads(seed=1), GREEDY), GreedyVerifier(), FixedGamma(gamma),
                      runner=make_runner(target.model, graphs=graphs)) for graphs in ("off", "on")]
    assert pipes[0].proposer.graphs is None and pipes[1].proposer.graphs is not None
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    plain = [pipes[0].run(p, max_new_tokens=16, speculative=False).token_ids for p in prompts]
    drafts = [recording(pipe) for pipe in pipes]
    outputs = [[o.token_ids for o in pipe.generate_batch(prompts, max_new_tokens=16)]
               + [pipe.run(p, max_new_tokens=16).token_ids for p in prompts] for pipe in pipes]
    assert outputs == [plain * 2, plain * 2]
    assert drafts[0] == drafts[1] and sum(len(rows[0]) for rows, _ in drafts[0]) > 10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("controller", ["fixed", "confidence"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_graphed_eagle_chain_drafts_what_the_eager_chain_drafts(head, controller, device):
    """Where the target's steps are graphed, a greedy EAGLE or EAGLE-3 chain runs as one graph
    per (row, γ) over the head's preallocated slots: step for step it drafts and keeps what the
    eager chain does (early stops included), the output is plain decoding's, one sequence or a
    batch, and on a GPU a second generation captures nothing new."""
    from test_eagle3 import target4

    target, make = target4(), eagle_heads()[head]
    controllers = {"fixed": lambda: FixedGamma(4), "confidence": lambda: ConfidenceGamma(4, 1, 4, threshold=0.3)}
    eager = Pipeline(target, make(), GreedyVerifier(), controllers[controller](),
                     runner=make_runner(target.model, device=device, graphs="off"))
    graphed = Pipeline(target, make(), GreedyVerifier(), controllers[controller](),
                       runner=make_runner(target.model, device=device, graphs="on"))
    assert eager.proposer.graphs is None and graphed.proposer.graphs is not None
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    plain = [eager.run(p, max_new_tokens=24, speculative=False).token_ids for p in prompts]
    drafts = [recording(eager), recording(graphed)]
    for prompt, want in zip(prompts, plain):
        ran = [eager.run(prompt, max_new_tokens=24), graphed.run(prompt, max_new_tokens=24)]
        assert [r.token_ids for r in ran] == [want, want]
        assert ran[0].stats.accepted_at == ran[1].stats.accepted_at
    assert drafts[0] == drafts[1] and sum(len(rows[0]) for rows, _ in drafts[0]) > 20
    if controller == "confidence":  # some chains stopped early, and the graphed ones stopped with them
        assert any(0 < len(rows[0]) < 4 for rows, _ in drafts[1])
    assert [o.token_ids for o in graphed.generate_batch(prompts, max_new_tokens=24)] == plain
    captures = graphed.proposer.graphs.captures
    assert (captures > 0) == (device == "cuda")
    assert [o.token_ids for o in graphed.generate_batch(prompts, max_new_tokens=24)] == plain
    assert [graphed.run(p, max_new_tokens=24).token_ids for p in prompts] == plain
    assert graphed.proposer.graphs.captures == captures


def confidences(pipe: Pipeline) -> list:
    """Each step's draft confidence (row 0, the tokens counted), from now on."""
    propose, log = pipe.proposer.propose, []

    def logged(rows, gammas):
        draft = propose(rows, gammas)
        log.append(draft.confidence[0, : int(draft.num_draft[0])].float())
        return draft

    pipe.proposer.propose = logged
    return log


def test_a_graphed_eagle3_chain_attends_over_a_growing_width():
    """A graphed EAGLE-3 feed and chain attend over the narrowest width of the head's slots
    that holds the draft (256, 512, ...; a graph each), so a long request's drafts move to a
    wider one as it grows: step for step they draft what the eager chain drafts, whose
    attention reads exactly the rows cached, and the output is plain decoding's."""
    from test_eagle3 import target4

    target = target4()
    target.model.config.max_position_embeddings = 1024
    make = eagle_heads()["eagle3"]
    pipes = [Pipeline(target, make(), GreedyVerifier(), FixedGamma(4),
                      runner=make_runner(target.model, graphs=graphs, cache_len=1024)) for graphs in ("off", "on")]
    graphs = pipes[1].proposer.graphs.graphs
    keys, run = [], graphs.run
    graphs.run = lambda key, compute: keys.append(key) or run(key, compute)
    drafts = [recording(pipe) for pipe in pipes]
    confidence = [confidences(pipe) for pipe in pipes]  # each draft token's top probability: the head's output
    for length in range(244, 256):  # drafts start below 256 slots and pass them, at every offset
        prompt = [(5 * i) % 60 + 2 for i in range(length)]
        want = pipes[0].run(prompt, max_new_tokens=16, speculative=False).token_ids
        assert [pipe.run(prompt, max_new_tokens=16).token_ids for pipe in pipes] == [want, want]
    assert drafts[0] == drafts[1] and sum(len(rows[0]) for rows, _ in drafts[0]) > 100
    torch.testing.assert_close(torch.cat(confidence[1]), torch.cat(confidence[0]), rtol=0, atol=1e-6)
    assert {key[-1] for key in keys if key[0] == "chain"} == {256, 512}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("controller", ["fixed", "confidence"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_graphed_sampled_eagle_chain_draws_what_the_eager_chain_draws(head, controller, device):
    """A sampled chain runs as one graph per (row, γ) too: each position's race draws come from
    the row's generator for the step, drawn into a buffer before the replay, so with the same
    seed the graphed pipeline drafts, keeps and emits what the eager one does (early stops
    included), one sequence or a batch, and a second generation captures nothing new."""
    from specpipe.verifiers.rejection import RejectionVerifier
    from test_eagle3 import target4

    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    target, make = target4(), eagle_heads(sampling=sampling)[head]
    controllers = {"fixed": lambda: FixedGamma(4), "confidence": lambda: ConfidenceGamma(4, 1, 4, threshold=0.3)}
    pipes = [Pipeline(target, make(), RejectionVerifier(sampling), controllers[controller](), sampling=sampling,
                      runner=make_runner(target.model, device=device, graphs=graphs)) for graphs in ("off", "on")]
    eager, graphed = pipes
    assert eager.proposer.graphs is None and graphed.proposer.graphs is not None
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    drafts = [recording(eager), recording(graphed)]
    for seed, prompt in enumerate(prompts):
        ran = [pipe.run(prompt, max_new_tokens=24, seed=seed) for pipe in pipes]
        assert ran[0].token_ids == ran[1].token_ids and ran[0].stats.accepted_at == ran[1].stats.accepted_at
    assert drafts[0] == drafts[1] and sum(len(rows[0]) for rows, _ in drafts[0]) > 20
    assert len({tuple(rows[0]) for rows, _ in drafts[0]}) > 10  # sampled: the drafts differ step to step
    if controller == "confidence":
        assert any(0 < len(rows[0]) < 4 for rows, _ in drafts[1])
    def batch(pipe):
        return [o.token_ids for o in pipe.generate_batch(prompts, max_new_tokens=24, seed=5)]

    assert batch(eager) == batch(graphed)
    captures = graphed.proposer.graphs.captures
    assert (captures > 0) == (device == "cuda")
    assert batch(eager) == batch(graphed)  # the controllers' state moved on alike
    assert graphed.proposer.graphs.captures == captures


@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_an_eager_draft_wider_than_the_graphs_grows_the_head_slots_and_stays_exact(head, monkeypatch):
    """A tree deeper than the graphs take (depth ≥ 32) is searched eagerly over the same head
    slots, every depth of it (as every search is: it reads nothing back to stop early); near the
    cache's end its rows pass them, and the slots grow (the row's graphs are captured again)
    instead of failing: the output is plain decoding's to the cache's end."""
    from test_eagle3 import target4


    target, make = target4(), eagle_heads(TreeShape(8, 40))[head]  # slots: the cache's 128 + 32 · 8
    pipe = Pipeline(target, make(), GreedyVerifier(), FixedGamma(40, 1, 40),
                    runner=make_runner(target.model, graphs="on", kernels="fast", cache_len=128))
    want = pipe.run(REPEATING, max_new_tokens=110, speculative=False).token_ids
    assert pipe.run(REPEATING, max_new_tokens=110).token_ids == want
    caches = list(pipe.proposer.graphs._caches.values())
    assert [cache.grown for cache in caches] == [1] and caches[0].capacity > 128 + 32 * 8


class _CaptureRig:
    """torch.cuda's stream and graph calls as `graphs.capture` makes them, recorded on the CPU
    (no GPU here): a capture whose computation fails ends with an error of its own, as
    `CUDAGraph.capture_end` does after an invalidated capture, and leaves its stream current."""

    def __init__(self, monkeypatch):
        self.current, self.pools = "default", []
        rig = self

        class Graph:
            def __init__(self, graph, pool=None, stream=None):
                rig.pools.append(pool)

            def __enter__(self):
                rig.current = "capture"

            def __exit__(self, kind, value, traceback):
                if kind is not None:
                    raise RuntimeError("operation failed due to a previous error during capture")
                rig.current = "default"

        class Side:
            def __init__(self, *args):
                pass

            def wait_stream(self, other):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        monkeypatch.setattr(torch.cuda, "Stream", Side)
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Side() if rig.current else None)
        monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: setattr(rig, "current", "default"))
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
        monkeypatch.setattr(torch.cuda, "graph", Graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))


def test_a_failed_capture_names_the_operation_that_failed_and_restores_the_stream(monkeypatch):
    """The error names what the computation raised, not the capture's own error after it, and
    the stream the capture switched to is no longer current; the graphs of one component share
    one memory pool."""
    from specpipe.engine import graphs
    from specpipe.errors import SpecpipeError

    rig = _CaptureRig(monkeypatch)
    owner = graphs.Graphs(torch.device("cpu"))
    owner.capture = True  # as on a GPU
    owner.ensure("a", lambda: torch.zeros(1))
    owner.ensure("b", lambda: torch.zeros(1))
    assert owner.captures == 2 and rig.pools == [("pool",), ("pool",)] and rig.current == "default"

    def refused():
        if rig.current == "capture":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return torch.zeros(1)

    with pytest.raises(SpecpipeError, match=r"failed \(CUDA error: operation not permitted when stream is "
                                            r"capturing\)\. .*graphs=off"):
        owner.ensure("c", refused)
    assert rig.current == "default" and owner.captures == 2


def test_the_capture_hazard_watch_names_what_a_capture_refuses_and_passes_the_rest():
    """The watch the graphed computations run under sees each kind of hazard (so its silence
    below means something), and passes what graphs are made of: gathers by integer indices,
    in-place writes at device-side slots, attention without dropout, constants."""
    x, slots = torch.randn(6), torch.tensor([1, 3])
    hazards = {
        "boolean mask": lambda: x[x > 0],
        "masked write": lambda: x.__setitem__(x > 5, 0.0),
        "nonzero": lambda: torch.nonzero(x),
        "read": lambda: x.sum().item(),
        "draw": lambda: torch.empty(3).exponential_(1, generator=torch.Generator().manual_seed(0)),
        "host data": lambda: torch.tensor([1, 2]),
        "dropout": lambda: torch.nn.functional.scaled_dot_product_attention(*[x.view(1, 1, 2, 3)] * 3, dropout_p=0.5),
    }
    for kind, compute in hazards.items():
        with torch.inference_mode(), capture_hazards() as seen:
            compute()
        assert len(seen) == 1, kind
    with torch.inference_mode(), capture_hazards() as seen:
        x[slots], x.index_copy(0, slots, torch.zeros(2)), torch.full((2,), 3.0), torch.arange(4)
        torch.nn.functional.scaled_dot_product_attention(*[x.view(1, 1, 2, 3)] * 3, is_causal=True)
    assert seen == []


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("drafter", ["ngram", "draft model"])
def test_a_static_step_verifies_a_sampled_draft_inside_its_graph(drafter, kernels, monkeypatch):
    """With sampling, the static step runs the rejection verdict as its tail (the logits never
    leave it: `verify` is not called), a draft model's static step its sampled pick (`_pick`
    is not called), and, seed for seed, emits what the eager steps emit, one sequence or a
    batch, a one-hot draft (n-gram) and a draft model's probabilities alike."""
    from specpipe.verifiers.rejection import RejectionVerifier

    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    target = tiny_target(seed=0)

    def pipe(graphs: str) -> Pipeline:
        proposer = (NgramProposer() if drafter == "ngram"
                    else ModelDrafter(tiny_model(seed=0), sampling, graphs=graphs))
        return Pipeline(target, proposer, RejectionVerifier(sampling), FixedGamma(3), sampling=sampling,
                        runner=make_runner(target.model, graphs=graphs, kernels=kernels))

    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    eager = [[pipe("off").run(p, max_new_tokens=16, seed=s).token_ids for s, p in enumerate(prompts)],
             [o.token_ids for o in pipe("off").generate_batch(prompts, max_new_tokens=16, seed=3)]]
    monkeypatch.setattr(RejectionVerifier, "verify", lambda *a: pytest.fail("verified from the logits"))
    monkeypatch.setattr(ModelDrafter, "_pick", lambda *a: pytest.fail("picked from the logits"))
    graphed = pipe("on")
    assert [[graphed.run(p, max_new_tokens=16, seed=s).token_ids for s, p in enumerate(prompts)],
            [o.token_ids for o in graphed.generate_batch(prompts, max_new_tokens=16, seed=3)]] == eager
    assert len({tuple(t) for t in eager[0] + eager[1]}) == 6


def test_no_graphed_computation_reads_the_host_or_does_what_a_capture_refuses(monkeypatch):
    """What a CUDA graph captures may not read a value back to the host (a read while a stream
    captures is an error on a GPU, and a replay would not repeat it), index by a boolean mask,
    draw random numbers or make tensors from host data: every graphed computation (the target's
    static step in both block policies with its greedy and rejection verdicts, a draft model's
    with its greedy and sampled picks, Medusa's heads, EAGLE and EAGLE-3 heads' feeds of
    committed rows, chains, greedy and sampled, and tree searches) runs here
    under the host-read counter and the capture-hazard watch (`decode.syncs.capture_hazards`),
    and neither sees anything."""
    from specpipe.engine.graphs import Graphs
    from specpipe.verifiers.rejection import RejectionVerifier
    from test_eagle3 import target4

    reads: dict[str, list[int]] = {}
    hazards: list[str] = []
    run = Graphs.run

    def counted(self, key, compute):
        def watched():
            with host_reads() as seen, capture_hazards() as refused:
                out = compute()
            kind = key[0] if isinstance(key, tuple) else {Shape: "static step", int: "medusa"}[type(key)]
            reads.setdefault(kind, []).append(len(seen))
            hazards.extend(f"{kind}: {why}" for why in refused)
            return out
        return run(self, key, watched)

    monkeypatch.setattr(Graphs, "run", counted)
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    target = tiny_target(seed=0)
    for kernels in KERNELS:
        pipe, _ = pipelines(kernels, ModelDrafter(tiny_model(seed=0), GREEDY, graphs="on"), FixedGamma(3))
        pipe.generate_batch(prompts, max_new_tokens=12)
    Pipeline(target, MedusaProposer(random_heads(seed=1), GREEDY), GreedyVerifier(), FixedGamma(3),
             runner=make_runner(target.model, graphs="on")).generate_batch(prompts, max_new_tokens=12)
    sampled = SamplingParams(temperature=0.8)  # Medusa's heads graphed without the greedy pick
    Pipeline(target, MedusaProposer(random_heads(seed=1), sampled), RejectionVerifier(sampled), FixedGamma(3),
             sampling=sampled, runner=make_runner(target.model, graphs="on")).generate_batch(prompts, max_new_tokens=12)
    target = target4()
    for make in eagle_heads().values():
        Pipeline(target, make(), GreedyVerifier(), FixedGamma(3),
                 runner=make_runner(target.model, graphs="on")).generate_batch(prompts, max_new_tokens=12)
    sampling = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
    small = tiny_target(seed=0)  # a draft model's sampled pick and the rejection verdict, each a tail
    Pipeline(small, ModelDrafter(tiny_model(seed=0), sampling, graphs="on"), RejectionVerifier(sampling),
             FixedGamma(3), sampling=sampling, runner=make_runner(small.model, graphs="on")).generate_batch(
        prompts, max_new_tokens=12)
    for make in eagle_heads(sampling=sampling).values():
        Pipeline(target, make(), RejectionVerifier(sampling), FixedGamma(3), sampling=sampling,
                 runner=make_runner(target.model, graphs="on")).generate_batch(prompts, max_new_tokens=12)
    for make in eagle_heads(TreeShape(3, 8)).values():
        tree = Pipeline(target, make(), GreedyVerifier(), FixedGamma(3), runner=make_runner(target.model, graphs="on",
                                                                                            kernels="fast"))
        for prompt in prompts:
            tree.run(prompt, max_new_tokens=12)
    assert {kind: (len(counts) > 5, set(counts)) for kind, counts in reads.items()} == {
        "static step": (True, {0}), "medusa": (True, {0}), "medusa pick": (True, {0}), "feed": (True, {0}),
        "chain": (True, {0}), "tree": (True, {0})}
    assert sorted(set(hazards)) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_graphed_eagle_tree_search_drafts_what_the_eager_search_drafts(head, device):
    """With kernels=fast (the block policy that verifies trees) an EAGLE-2 search runs as one
    graph per row and depth over the head's preallocated slots, every depth searched: step for step it
    keeps the tree the eager search keeps (which on the CPU stops at a depth no node of could be
    kept), and the output is plain decoding's."""
    from test_eagle3 import target4

    target, make = target4(), eagle_heads(TreeShape(3, 8))[head]
    runners = [make_runner(target.model, device=device, graphs=graphs, kernels="fast") for graphs in ("off", "on")]
    eager, graphed = [Pipeline(target, make(), GreedyVerifier(), FixedGamma(4), runner=r) for r in runners]
    drafts = [recording(eager), recording(graphed)]
    for prompt in (REPEATING, PROMPT, [3, 60, 22]):
        want = eager.run(prompt, max_new_tokens=20, speculative=False).token_ids
        assert [p.run(prompt, max_new_tokens=20).token_ids for p in (eager, graphed)] == [want, want]
    assert drafts[0] == drafts[1] and all(tree is not None for _, tree in drafts[1]) and len(drafts[1]) > 20
    assert (graphed.proposer.graphs.captures > 0) == (device == "cuda")


@pytest.mark.full  # 30 s of torch.compile; compile is off by default
def test_a_compiled_stack_runs_the_static_step_exactly():
    """compile=true with graphs=on: the static step's one shape compiles once (the prompt's
    eager-shaped forward is the other graph), speculative output is plain decoding's, and a
    second generation compiles nothing."""
    from specpipe.engine.compile import graphs_compiled

    target = tiny_target(seed=0, dtype=torch.float32)
    eager = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, graphs="off"))
    pipe = Pipeline(target, NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), FixedGamma(4),
                    runner=make_runner(target.model, graphs="on", compile=True))
    want = [eager.run(p, max_new_tokens=20, speculative=False).token_ids for p in (REPEATING, PROMPT)]
    assert pipe.run(REPEATING, max_new_tokens=20).token_ids == want[0]
    compiled = graphs_compiled()
    assert [pipe.run(p, max_new_tokens=20).token_ids for p in (REPEATING, PROMPT)] == want
    assert pipe.run(PROMPT, max_new_tokens=20, speculative=False).token_ids == want[1]
    assert graphs_compiled() == compiled and pipe.runner.static.shapes == {Shape(1, 5, False, (), "greedy", WIDTH_MIN)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernels", KERNELS)
def test_a_static_step_reads_the_host_once(kernels, device):
    """The static step adds no read back to the host: a step's one read is the verdict's."""
    pipe, _ = pipelines(kernels, *PROPOSERS["ngram"](device), device=device)
    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    counts = reads_per_step(Decoder(pipe, len(prompts)), [Request(p, 12) for p in prompts])
    assert len(counts) > 2 and max(counts) == 1, counts


def test_a_graphed_step_launches_a_few_operations_beside_its_graph():
    """What a step costs the host beyond its graphs: a graphed step is its graph, which
    verifies too, and a few operations (the inputs staged, the verdict's copy), against one per
    operation of every layer when eager; an ngram step adds its draft's staging. A change that
    adds work to every step outside the graphs fails here, on the CPU (which counts host-side
    operations too; tests/test_simulated_cuda.py counts a GPU's launches alone)."""
    from specpipe.decode.syncs import per_step

    target = tiny_target(seed=0)
    counts = {}
    for name, proposer, controller in (("plain", None, None), ("ngram", NgramProposer(), FixedGamma(3))):
        for graphs in ("off", "on"):
            pipe = Pipeline(target, proposer, GreedyVerifier(), controller,
                            runner=make_runner(target.model, graphs=graphs))
            steps = per_step(Decoder(pipe, 1), [Request(REPEATING, 12)])
            counts[name, graphs] = max(count.launches for count in steps[1:])  # the first fills the cache
    assert counts["plain", "on"] <= 6 and counts["ngram", "on"] <= 10, counts
    assert counts["plain", "off"] > 6 * counts["plain", "on"], counts  # 2 layers eager: ~60 launches


def test_a_graphed_step_runs_fifteen_kernels_a_layer(monkeypatch):
    """What a replay costs the device: on a small model each kernel is ~1.3-2.8 µs on a GPU
    however it is launched, so the static step's operations a layer bound its speed. In bf16
    (a GPU's precision) a layer is 15: two norms, four matmuls (the residual adds inside the
    output projections' GEMMs), rotary as three (in the activations' dtype, no casts: a product,
    the half swap, a multiply-add written into the projection's output), one cache write (keys
    and values side by side), the queries' and the output's regrouping, attention, the gate's
    two. A change that adds one to every layer fails here; the 2-layer and 4-layer steps differ
    by exactly two layers' worth. The bf16 matmuls take their dense path, a GPU's (on CPUs with
    AMX they would take oneDNN's prepacked blocks: a padding and a separate add more)."""
    from specpipe.decode.syncs import per_step

    monkeypatch.setattr("specpipe.models.linears.has_amx", lambda: False)
    inside = {}
    for layers in (2, 4):
        target = LoadedModel("tiny", tiny_model(0, layers=layers), tiny_target().tokenizer)
        pipe = Pipeline(target, NgramProposer(), GreedyVerifier(), FixedGamma(4),
                        runner=make_runner(target.model, precision="bf16", graphs="on"))
        steps = per_step(Decoder(pipe, 1), [Request(REPEATING, 6)])  # exact: every step a 5-token block
        inside[layers] = max(count.inside for count in steps[1:])  # the first fills the cache
    assert inside[4] - inside[2] == 2 * 15, inside
    assert inside[2] - 2 * 15 <= 36, inside  # the step's own: mask, positions, embedding, head, greedy verdict


@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_graphed_eagle_step_feeds_and_drafts_in_graphs(head):
    """An EAGLE or EAGLE-3 step with the target's steps graphed: the head's feed of the rows the
    last verdict kept, its draft and the target's verify are three graphs, and the step launches
    few operations beside them (the verdict, the rows' features, the copies in), where the
    eager head alone launches one per operation of its layer at every feed and draft token."""
    from specpipe.decode.syncs import per_step
    from test_eagle3 import target4

    target, make = target4(), eagle_heads()[head]
    counts = {}
    for graphs in ("off", "on"):
        pipe = Pipeline(target, make(), GreedyVerifier(), FixedGamma(3),
                        runner=make_runner(target.model, graphs=graphs))
        steps = per_step(Decoder(pipe, 1), [Request(REPEATING, 16)])
        counts[graphs] = sorted(count.launches for count in steps[1:-1])[-1]  # the first fills, the last is plain
    assert counts["on"] <= 45 and counts["off"] > 4 * counts["on"], counts


def test_exact_static_plans_the_widest_block_and_takes_chains_only():
    """The block is planned from the controller's widest γ (a schedule's included) and the
    proposer's tree; exact static steps take no trees, so a tree proposer drafts chains."""
    target = tiny_target(seed=0)
    heads = random_heads(seed=1)
    tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    for kernels, trees, block in (("exact", False, 1 + 3), ("fast", True, 1 + len(tree))):
        runner = make_runner(target.model, graphs="on", kernels=kernels)
        Pipeline(target, MedusaProposer(heads, GREEDY, tree=tree), GreedyVerifier(), FixedGamma(3), runner=runner)
        assert (runner.trees, runner.static.block) == (trees, block)
    controller = FixedGamma(2)
    controller.schedule = {2: 5}
    runner = make_runner(target.model, graphs="on")
    Pipeline(target, NgramProposer(), GreedyVerifier(), controller, runner=runner)
    assert runner.static.block == 1 + 5
    # an adaptive controller's bound; the confidence controller keeps its γ (it stops drafts early)
    for controller, widest in ((HeuristicGamma(2, 1, 6), 6), (guarded(ConfidenceGamma(4, 1, 6)), 4)):
        runner = make_runner(target.model, graphs="on")
        Pipeline(target, NgramProposer(), GreedyVerifier(), controller, runner=runner)
        assert runner.static.block == 1 + widest
    assert make_runner(target.model).static is None  # graphs=auto: eager on the CPU


def test_check_names_the_step_and_the_guarantee_that_runs(model_dirs):
    from specpipe.build import config_checks
    from specpipe.config import compose

    def guarantee(*settings):
        checks = config_checks(compose([f"model={model_dirs / 'target'}", "proposer=ngram", *settings]))
        engine = next(c for c in checks if c.name == "engine")
        return engine.why, next(c for c in checks if c.name == "verify guarantee").why

    engine, why = guarantee()
    assert "eager" in engine and why.startswith("none: verify rows equal one-token rows to ~1e-5")
    engine, why = guarantee("graphs=on")
    assert "static decode steps" in engine and "run eagerly on the CPU" in engine
    assert why.startswith("exact by construction (none, graphs, kernels=exact)")
    assert guarantee("graphs=on", "kernels=fast")[1].startswith("tolerance (none, graphs, kernels=fast)")
    refusals = [c.why for c in config_checks(compose([f"model={model_dirs / 'target'}", "graphs=on", "engine=hf"]))
                if c.status == "refuse"]
    assert any("graphs=on needs the native engine" in why for why in refusals)
    refusals = [c.why for c in config_checks(compose([f"model={model_dirs / 'target'}", "kernels=fastest"]))
                if c.status == "refuse"]
    assert any("kernels is one of exact, fast" in why for why in refusals)
    notes = config_checks(compose([f"model={model_dirs / 'target'}", "kernels=fast"]))  # eager: nothing to choose
    assert [c.status for c in notes if c.name == "kernels"] == ["n/a"]
    assert not [c for c in config_checks(compose([f"model={model_dirs / 'target'}", "graphs=on", "kernels=fast"]))
                if c.name == "kernels"]


def test_a_pipeline_from_config_runs_the_target_and_its_draft_static(model_dirs):
    """graphs= is the pipeline's: the target's steps in its block policy, the draft's with the fewest rows."""
    from specpipe.config import compose

    pipe = Pipeline.from_config(compose([f"model={model_dirs / 'target'}", "graphs=on", "proposer=draft",
                                         f"proposer.model={model_dirs / 'draft'}", "gamma=3"]))
    assert pipe.runner.step == "static exact" and pipe.proposer.runner.step == "static fast"
    run = pipe.run("w5 w9 w5 w9 w5", max_new_tokens=12)
    assert run.token_ids == pipe.run("w5 w9 w5 w9 w5", max_new_tokens=12, speculative=False).token_ids
