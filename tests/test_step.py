"""The decode step stays on the device: at most ONE read back to the host per step (the
verdict's copy), for every proposer that drafts on the device, chains and a tree; and the
batched verifiers' layout (ids padded with -1, num_accepted per row, rows of their own γ).

On the CPU a read is not a sync, but the same code runs on a GPU, where it is: the test counts
every Python-level call that would read a tensor back (`item`, `tolist`, `cpu`, `numpy`,
`bool()`, `int()`, `float()`, `__index__`) while a step runs."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import PROMPT, tiny_model, tiny_target
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.guard import guarded
from specpipe.decode.loop import Decoder
from specpipe.decode.syncs import reads_per_step
from specpipe.drafts import DraftBatch
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline, Request
from specpipe.proposers.dflash import DFlashProposer
from specpipe.proposers.eagle import EagleProposer, TreeShape
from specpipe.proposers.eagle3 import proposer_for
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import RequestCache, SuffixProposer
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.types import PAD
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from test_dflash import random_drafter
from test_eagle import copy_head
from test_eagle3 import random_head as eagle3_head
from test_eagle3 import target4
from test_medusa import random_heads

GREEDY = SamplingParams()
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


def counts_of(pipe: Pipeline, prompts: list[list[int]], tokens: int = 12) -> list[int]:
    """Host reads of each step of decoding `prompts` together."""
    return reads_per_step(Decoder(pipe, len(prompts)), [Request(p, tokens) for p in prompts])


PROPOSERS = {
    "ngram": lambda device: NgramProposer(ngram_max=3, ngram_min=1),
    "draft": lambda device: ModelDrafter(tiny_model(seed=7, layers=1), GREEDY, device=device),
    "draft-sampled": lambda device: ModelDrafter(tiny_model(seed=7, layers=1), SamplingParams(temperature=0.8),
                                                 device=device),
    "medusa": lambda device: MedusaProposer(random_heads(seed=1), GREEDY),
    "medusa-tree": lambda device: MedusaProposer(random_heads(seed=1), GREEDY, tree=[[0], [1], [0, 0], [0, 1]]),
    "eagle": lambda device: EagleProposer(copy_head(), GREEDY),
    "eagle3": lambda device: proposer_for(eagle3_head(1), GREEDY),
    "dflash": lambda device: DFlashProposer(random_drafter(1), GREEDY),
    "suffix": lambda device: SuffixProposer(RequestCache(24, 1000, 50000), tree=False),
    "eagle-tree": lambda device: EagleProposer(copy_head(), GREEDY, TreeShape(top_k=2, nodes=5)),
    "suffix-tree": lambda device: SuffixProposer(RequestCache(24, 1000, 50000), tree=True),
}
HEADS_OF_LAYERS = ("eagle3", "dflash")  # read the target's layers 1-3: the 4-layer tiny target


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_a_step_reads_the_host_once(proposer, device):
    """On a GPU (the `cuda` cases, run by benchmarks/gpu_check.sh) each read is a real sync."""
    target = target4() if proposer in HEADS_OF_LAYERS else tiny_target(seed=0)
    sampled = proposer.endswith("sampled")
    verifier = RejectionVerifier(SamplingParams(temperature=0.8)) if sampled else GreedyVerifier()
    pipe = Pipeline(target, PROPOSERS[proposer](device), verifier, FixedGamma(3),
                    runner=make_runner(target.model, device=device))
    counts = counts_of(pipe, [REPEATING, PROMPT, [3, 60, 22]])  # trees too: a batch of three
    assert len(counts) > 2 and max(counts) == 1, counts  # the verdict's one copy, and nothing else
    assert pipe.run(REPEATING, max_new_tokens=12).stats.drafted > 0  # it really drafted


def test_batched_greedy_verdict_layout():
    """Rows of different draft lengths in one block: each accepts its own prefix, -1 after."""
    vocab = 8
    draft = DraftBatch(torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]]), torch.tensor([3, 2, 0]), (3, 2, 0))
    argmax = torch.tensor([[1, 2, 7, 5], [4, 6, 6, 6], [3, 3, 3, 3]])  # [B, W + 1]
    logits = torch.nn.functional.one_hot(argmax, vocab).float()
    verdict = GreedyVerifier().verify(draft, logits, [])
    assert verdict.num_accepted.tolist() == [2, 1, 0]
    assert verdict.ids.tolist() == [[1, 2, 7, PAD], [4, 6, PAD, PAD], [3, PAD, PAD, PAD]]
    host = verdict.to_host()
    assert [h.emitted for h in host] == [[1, 2, 7], [4, 6], [3]]
    assert [h.gamma for h in host] == [3, 2, 0]


def test_a_request_can_opt_out_of_speculation_inside_a_speculating_batch():
    """Per-row draft lengths: one request decodes plainly (γ = 0 every step) while its batch
    speculates; every row still equals plain greedy decoding."""
    target = tiny_target(seed=0)
    pipe = Pipeline(target, NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), FixedGamma(3))
    prompts = [REPEATING, REPEATING + [9], PROMPT]
    outs = pipe.generate_batch(prompts, max_new_tokens=16, speculative=[True, False, True])
    plain = [pipe.run(p, max_new_tokens=16, speculative=False).token_ids for p in prompts]
    assert [o.token_ids for o in outs] == plain
    assert outs[1].stats.drafted == 0 and set(outs[1].stats.gamma_trace) == {0}
    assert outs[0].stats.drafted > 0


class Recording(FixedGamma):
    """Keeps every step's timing."""

    def __init__(self, gamma: int):
        super().__init__(gamma)
        self.timings = []

    def update(self, slots, verdicts, timing, batch) -> None:
        self.timings.append(timing)
        super().update(slots, verdicts, timing, batch)


@pytest.mark.parametrize("guard", [False, True])
def test_the_step_records_each_step_in_the_meter_its_controllers_read(guard):
    """Step 7: the step records each step's cost in the meter, then calls the controller's
    `update`; a guard and the controller it wraps read one meter, so a step is recorded once."""
    inner = Recording(3)
    controller = guarded(inner, guard)
    pipe = Pipeline(tiny_target(seed=0), NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), controller)
    pipe.run(REPEATING, max_new_tokens=24)
    assert controller.meter is inner.meter
    assert inner.meter.steps == len(inner.timings) > 0
    assert inner.meter.verify_samples(64, 64)  # the steps' costs, there for the controllers to read


class WorkClock:
    """A step clock that moves only by the work a test says was done (plus a microsecond a read):
    timings that a loaded machine cannot make flaky."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now


def proposer_cache(proposer) -> int:
    """Tokens row 0 of a proposer's own cache holds: a draft model's KV cache, an EAGLE head's rows."""
    if hasattr(proposer, "rows"):
        return proposer.rows[0].committed if 0 in proposer.rows else 0
    return int(proposer.runner.lengths[0])


@pytest.mark.parametrize("proposer", ["draft", "eagle"])
def test_a_proposers_cache_fill_is_timed_apart_from_its_drafts(proposer, monkeypatch):
    """A draft model fills its cache with the prompt on the row's first draft, an EAGLE head
    feeds the prompt's features: `StepTiming.fill_s`, so a controller reads the drafts' cost
    from `propose_s` alone; later steps feed one or two tokens with the draft itself. The step
    clock is scripted: it moves a second for each token the fill feeds the proposer's cache."""
    from specpipe.decode import timing

    clock = WorkClock()
    monkeypatch.setattr(timing, "time", clock)
    target = tiny_target(seed=0)
    controller = Recording(3)
    pipe = Pipeline(target, PROPOSERS[proposer]("cpu"), GreedyVerifier(), controller)
    fill, fed = pipe.proposer.fill, []

    def counted(rows, gammas):
        before = proposer_cache(pipe.proposer)
        fill(rows, gammas)
        fed.append(proposer_cache(pipe.proposer) - before)
        clock.now += fed[-1]

    monkeypatch.setattr(pipe.proposer, "fill", counted)
    prompt = REPEATING + PROMPT  # longer than the head's FILL_MIN rows
    got = pipe.run(prompt, max_new_tokens=12)
    assert got.token_ids == pipe.run(prompt, max_new_tokens=12, speculative=False).token_ids
    first, *later = controller.timings
    assert fed[0] >= len(prompt) - 2 and not any(fed[1:]), fed  # the prompt once, then nothing
    assert first.fill_s >= fed[0] and all(t.fill_s < 1e-3 for t in later), [t.fill_s for t in controller.timings]
    assert first.propose_s < 1e-3  # the fill's work is not the draft's
    assert first.total_s == pytest.approx(first.fill_s + first.propose_s + first.verify_s)
    assert got.stats.propose_s >= first.fill_s  # the fill is the proposer's time in the stats


def test_a_graph_capture_is_the_steps_setup_time(monkeypatch):
    """A CUDA graph captured inside a step (a shape's or a draft's first use: here its time is
    scripted on the CPU, which captures nothing) is that step's `setup_s`, within its time as a
    wall clock counts it, and no other step's; controllers learn no cost from that step."""
    import time

    from specpipe.engine import graphs

    target = tiny_target(seed=0)
    controller = Recording(3)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), controller)
    forward, calls = pipe.runner.forward, []

    def capturing(*args, **kwargs):
        calls.append(None)
        if len(calls) in (3, 5):  # two steps capture: 20 ms each, as a capture's warm-up and record take
            time.sleep(0.02)
            monkeypatch.setattr(graphs, "_captured", [graphs.captured_s() + 0.02])
        return forward(*args, **kwargs)

    monkeypatch.setattr(pipe.runner, "forward", capturing)
    got = pipe.run(PROMPT, max_new_tokens=12)
    assert got.token_ids == pipe.run(PROMPT, max_new_tokens=12, speculative=False).token_ids
    setup = [timing.setup_s for timing in controller.timings[:6]]
    assert setup == [0, 0, pytest.approx(0.02), 0, pytest.approx(0.02), 0], setup
    assert all(timing.verify_s >= timing.setup_s for timing in controller.timings)
    assert got.stats.setup_s == pytest.approx(0.04) and got.stats.to_dict()["setup_s"] == got.stats.setup_s


@pytest.mark.parametrize("overlap", ["off", "on"])
@pytest.mark.parametrize("proposer", [None, "ngram"])
def test_the_host_work_between_steps_counts_as_decode_time(overlap, proposer):
    """A consumer that takes 5 ms per event: that time is the host's between steps (the device
    would wait through it), so it is in `host_s` and tokens/s, as in a wall clock of the decode.
    Every step but the first (and, overlapped, the second: it was queued before) carries it."""
    import time

    pipe = Pipeline(tiny_target(seed=0), NgramProposer(4, 1) if proposer else None, GreedyVerifier(),
                    FixedGamma(3) if proposer else None, overlap=overlap)
    started = time.perf_counter()
    for event in pipe.generate([3, 60, 22] * 3, max_new_tokens=10, speculative=proposer is not None):
        time.sleep(0.005)
    wall = time.perf_counter() - started - event.stats.prefill_s
    stats = event.stats
    assert stats.steps >= 3 and stats.host_s >= (stats.steps - 2) * 0.005
    # against the test's own clock: the consumer's sleeps are inside decode_s, and decode_s inside the wall
    assert (stats.steps - 2) * 0.005 <= stats.decode_s <= wall


@pytest.mark.parametrize("device", DEVICES)
def test_an_eagle_tree_step_reads_its_shape_once(device):
    """EAGLE-2's dynamic tree searches on the device and keeps its parents there: the runner's
    mask and positions and the verifier's paths are built from them on the device, so a step
    reads the host once (the verdict's copy), on a GPU and on the CPU alike, one row or three."""
    target = tiny_target(seed=0)
    pipe = Pipeline(target, EagleProposer(copy_head(), GREEDY, TreeShape(top_k=2, nodes=5)), GreedyVerifier(),
                    FixedGamma(3), runner=make_runner(target.model, device=device))
    for prompts in ([REPEATING], [REPEATING, PROMPT, [3, 60, 22]]):
        counts = counts_of(pipe, prompts)
        assert len(counts) > 2 and max(counts) == 1, counts
    assert pipe.run(REPEATING, max_new_tokens=12).stats.drafted > 0


def one_hot_logits(top: list[list[int]], vocab: int) -> torch.Tensor:
    """[B, n, V] logits whose argmax at row b, column j is top[b][j]."""
    return torch.nn.functional.one_hot(torch.tensor(top), vocab).double()


def padded(block_logits: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, bucket: int, block: int,
           gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A static step's inputs around a verify block: logits [bucket, block, V], ids and counts
    with the block's rows in front and stale values everywhere else. A stale draft column
    holds the argmax it would be checked against, so a verdict that read past a row's count
    would keep it."""
    batch, width = tokens.shape
    logits = torch.randn(bucket, block, block_logits.shape[-1], dtype=block_logits.dtype, generator=gen)
    logits[:batch, : width + 1] = block_logits
    ids = torch.randint(0, block_logits.shape[-1], (bucket, block), generator=gen)
    ids[:, 1:] = logits[:, :-1].argmax(-1)
    ids[:batch, 1 : width + 1] = tokens
    stale = torch.randint(0, block, (bucket - batch,), generator=gen)
    return logits, ids, torch.cat([counts, stale])


# a greedy chain of three rows: every token kept (bonus), one kept then a recovered one, and
# rows whose count stops them where the columns after would match (a broken count mask keeps them)
GREEDY_TOP = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [5, 0, 0, 0]]  # the target's argmax [B, W + 1]
GREEDY_DRAFT = [[1, 2, 3], [1, 5, 3], [1, 2, 3], [5, 0, 0]]
GREEDY_COUNTS = [3, 3, 2, 0]
GREEDY_IDS = [[1, 2, 3, 4], [1, 2, -1, -1], [1, 2, 3, -1], [5, -1, -1, -1]]


def test_the_greedy_chain_verdict_is_the_hand_computed_one():
    """The greedy chain verdict, eager (`verify`, the exact block) and as a static step runs it
    (its tail over a padded block of stale rows and columns), is the verdict worked out by hand:
    ids, accepted counts, draft lengths and the host rows."""
    gen = torch.Generator().manual_seed(0)
    verifier = GreedyVerifier()
    logits = one_hot_logits(GREEDY_TOP, 7)
    counts = torch.tensor(GREEDY_COUNTS)
    draft = DraftBatch(torch.tensor(GREEDY_DRAFT), counts, (3,) * 4)
    block_logits, ids, stale_counts = padded(logits, draft.tokens, counts, 8, 6, gen)
    tail = verifier.tail(draft)
    for verdict in (verifier.verify(draft, logits),
                    verifier.verdict_of(tail.compute(block_logits, ids, stale_counts)[:4], draft)):
        assert verdict.ids.tolist() == GREEDY_IDS
        assert verdict.num_accepted.tolist() == [3, 1, 2, 0] and verdict.num_draft.tolist() == GREEDY_COUNTS
        assert [(v.n_accepted, v.emitted, v.gamma) for v in verdict.to_host()] == [
            (3, [1, 2, 3, 4], 3), (1, [1, 2], 3), (2, [1, 2, 3], 2), (0, [5], 0)]
    plain = DraftBatch.empty(2, "cpu")  # a plain step: the argmax, nothing accepted
    logits = one_hot_logits([[4], [6]], 7)
    block_logits, ids, stale_counts = padded(logits, plain.tokens, plain.num_draft, 4, 1, gen)
    for verdict in (verifier.verify(plain, logits),
                    verifier.verdict_of(verifier.tail(plain).compute(block_logits, ids, stale_counts)[:2], plain)):
        assert verdict.ids.tolist() == [[4], [6]] and verdict.num_accepted.tolist() == [0, 0]
        assert [(v.n_accepted, v.emitted) for v in verdict.to_host()] == [(0, [4]), (0, [6])]


def test_the_greedy_tree_verdict_is_the_hand_computed_one():
    """A tree (node 0 and 1 after the last token, 2 and 3 after node 0, 4 after node 2): the
    path whose every node is its parent row's argmax, its block rows, and the bonus after it;
    and no node kept when the first level misses."""
    parents = torch.tensor([[-1, -1, 0, 0, 2]])
    tokens = torch.tensor([[3, 7, 4, 9, 5]])
    draft = DraftBatch(tokens, torch.tensor([3]), (3,), tree=parents)
    # block rows: 0 the last token, i + 1 node i; node 0, 2 and 4 right, node 1 and 3 wrong
    verdict = GreedyVerifier().verify(draft, one_hot_logits([[3, 4, 8, 5, 1, 6]], 10))
    assert verdict.ids.tolist() == [[3, 4, 5, 6, -1, -1]] and verdict.num_accepted.tolist() == [3]
    (row,) = verdict.to_host()
    assert (row.n_accepted, row.emitted, row.path, row.last_row) == (3, [3, 4, 5, 6], (1, 3, 5), 5)
    verdict = GreedyVerifier().verify(draft, one_hot_logits([[2, 4, 8, 5, 1, 6]], 10))
    (row,) = verdict.to_host()
    assert (row.n_accepted, row.emitted, row.path, row.last_row) == (0, [2], (), 0)


def test_a_padded_tree_batchs_verdict_is_the_hand_computed_one():
    """Two rows in one tree batch: row 0 the tree above (5 nodes), row 1 three nodes (0 after
    the last token, 1 and 2 after node 0) padded with two padding nodes whose tokens are the
    target's argmax after the last token: they are never accepted, though row 1's first node
    misses. Greedy and typical (at temperature 0: the argmax) keep the same paths; and the
    verdict of a row that keeps nodes in a padded batch."""
    from specpipe.drafts import NO_NODE
    from specpipe.verifiers.typical import TypicalVerifier

    parents = torch.tensor([[-1, -1, 0, 0, 2], [-1, 0, 0, NO_NODE, NO_NODE]])
    top = [[3, 4, 8, 5, 1, 6], [2, 8, 1, 4, 9, 9]]  # the target's argmax at each block row
    missed = torch.tensor([[3, 7, 4, 9, 5], [5, 6, 8, 2, 2]])  # row 1: node 0 (5) misses 2
    kept = torch.tensor([[3, 7, 4, 9, 5], [2, 6, 8, 2, 2]])  # row 1: node 0 (2) and node 2 (8) right, node 1 wrong
    cases = [(missed, [[3, 4, 5, 6, -1, -1], [2, -1, -1, -1, -1, -1]], [3, 0], [[1, 3, 5, -1, -1, -1], [-1] * 6],
              [(3, [3, 4, 5, 6], (1, 3, 5), 5), (0, [2], (), 0)]),
             (kept, [[3, 4, 5, 6, -1, -1], [2, 8, 4, -1, -1, -1]], [3, 2], [[1, 3, 5, -1, -1, -1], [1, 3] + [-1] * 4],
              [(3, [3, 4, 5, 6], (1, 3, 5), 5), (2, [2, 8, 4], (1, 3), 3)])]
    for tokens, ids, accepted, path, host in cases:
        draft = DraftBatch(tokens, torch.tensor([3, 2]), (3, 3), tree=parents)
        for verifier in (GreedyVerifier(), TypicalVerifier(GREEDY)):
            verdict = verifier.verify(draft, one_hot_logits(top, 10), [RowRandom(0), RowRandom(1)])
            assert verdict.ids.tolist() == ids and verdict.num_accepted.tolist() == accepted, verifier
            assert verdict.num_draft.tolist() == [3, 2] and verdict.path.tolist() == path
            assert [(r.n_accepted, r.emitted, r.path, r.last_row) for r in verdict.to_host()] == host
    # a row of padding alone (no draft) emits the argmax of its last token and keeps nothing
    empty = DraftBatch(kept, torch.tensor([3, 0]), (3, 0), tree=torch.tensor([[-1, -1, 0, 0, 2], [NO_NODE] * 5]))
    rows = GreedyVerifier().verify(empty, one_hot_logits(top, 10)).to_host()
    assert (rows[1].n_accepted, rows[1].emitted, rows[1].path) == (0, [2], ())


def test_a_plain_steps_verdict_is_the_chain_verdict_without_its_kernels():
    """A step without a draft takes the greedy verifier's short path (the argmax alone): the
    verdict, and its host copy, are what the general chain verdict builds."""
    from specpipe.verifiers.base import chain_verdict

    logits = torch.randn(3, 1, 50)  # [B, 1, V]: a plain step of three rows
    draft = DraftBatch.empty(3, "cpu")
    short = GreedyVerifier().verify(draft, logits)
    general = chain_verdict(draft, torch.zeros(3, dtype=torch.long), logits[:, 0].argmax(-1))
    assert torch.equal(short.ids, general.ids) and torch.equal(short.num_accepted, general.num_accepted)
    assert [(v.emitted, v.n_accepted, v.gamma) for v in short.to_host()] == [
        ([int(t)], 0, 0) for t in logits[:, 0].argmax(-1)]


NEG = float("-inf")


def point(*mass: tuple[int, float]) -> list[float]:
    """A distribution over 5 tokens as logits: token -> probability (the rest excluded)."""
    logits = [NEG] * 5
    for token, p in mass:
        logits[token] = math.log(p)
    return logits


# Sampled chains whose outcome no draw can change: a token the target gives at least the draft's
# probability is always kept, one it excludes always rejected, and every next-token distribution
# has one token. Row 0 keeps both tokens (bonus 3); row 1 keeps one, its second (2) is excluded
# and the residual leaves only 4; row 2 drafted one, kept, where a second column (0) would also
# pass: its bonus is 0 from row 1, not 4 from row 2.
SAMPLED_TARGET = [[point((1, 1.0)), point((2, 1.0)), point((3, 1.0))],
                  [point((1, 1.0)), point((4, 1.0)), point((0, 1.0))],
                  [point((0, 1.0)), point((0, 1.0)), point((4, 1.0))]]
SAMPLED_DRAFT = [[1, 2], [1, 2], [0, 0]]
SAMPLED_COUNTS = [2, 2, 1]
SAMPLED_IDS = [[1, 2, 3], [1, 4, -1], [0, 0, -1]]


def draft_probs() -> torch.Tensor:
    """[3, 2, 5] draft distributions the tokens above may come from (row 1's second: half on
    the excluded 2, half on 4, so the residual is 4 alone)."""
    probs = torch.nn.functional.one_hot(torch.tensor(SAMPLED_DRAFT), 5).float()
    probs[1, 0] = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    probs[1, 1] = torch.tensor([0.0, 0.0, 0.5, 0.0, 0.5])
    return probs


@pytest.mark.parametrize("rule", ["rejection", "block"])
@pytest.mark.parametrize("probs", ["one-hot", "draft's"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampled_chain_verdict_is_the_hand_computed_one(rule, probs, temperature):
    """Rejection sampling and block verification on chains whose verdict is fixed whatever the
    draws: eager (`verify`) and as a static step runs it (its tail over a padded block, its
    inputs' buffers stale before its `fill`), for several seeds, the verdict worked out by hand."""
    from specpipe.sampling import RowRandom
    from specpipe.verifiers.block import BlockVerifier

    gen = torch.Generator().manual_seed(0)
    verifier = (RejectionVerifier if rule == "rejection" else BlockVerifier)(SamplingParams(temperature))
    logits = torch.tensor(SAMPLED_TARGET)
    counts = torch.tensor(SAMPLED_COUNTS)
    draft = DraftBatch(torch.tensor(SAMPLED_DRAFT), counts, (2, 3, 1), draft_probs() if probs == "draft's" else None)
    for seed in range(5):
        rngs = [RowRandom(seed=seed * 3 + b, step=seed) for b in range(3)]
        tail = verifier.tail(draft, rngs)
        block_logits, ids, stale_counts = padded(logits, draft.tokens, counts, 4, 5, gen)
        block_logits[3:] = 0.0  # stale rows: any distribution the sampling takes
        buffers = [torch.rand((4, *size), generator=gen) + 0.5 for size in tail.inputs.sizes(5, 5)]
        tail.inputs.fill(buffers)
        for verdict in (verifier.verify(draft, logits, rngs),
                        verifier.verdict_of(tail.compute(block_logits, ids, stale_counts, *buffers)[:3], draft)):
            assert verdict.ids.tolist() == SAMPLED_IDS and verdict.num_accepted.tolist() == [2, 1, 1]
            assert [(v.n_accepted, v.emitted, v.gamma) for v in verdict.to_host()] == [
                (2, [1, 2, 3], 2), (1, [1, 4], 2), (1, [0, 0], 1)]


def picks(drafter: ModelDrafter, tail, ids: torch.Tensor, logits: torch.Tensor, last: torch.Tensor,
          gen: torch.Generator) -> list[tuple]:
    """A draft step's pick, eager (`_pick`, the exact block) and as a static step runs it (the
    tail over a padded block: a stale row whose count is out of range, stale buffers before the
    tail's `fill`) -> (tokens [B], distributions [B, V] or None, top probabilities [B]) of each."""
    batch, width, vocab = logits.shape
    block = torch.randn(batch + 1, width + 1, vocab, generator=gen)
    block[:batch, :width] = logits
    counts = torch.cat([last, torch.tensor([9])])
    sizes = tail.inputs.sizes(width + 1, vocab) if tail.inputs is not None else ()
    buffers = [torch.rand((batch + 1, *size), generator=gen) for size in sizes]
    if tail.inputs is not None:
        tail.inputs.fill(buffers)
    graphed = tail.compute(block, torch.zeros(batch + 1, width + 1, dtype=torch.long), counts, *buffers)[:batch]
    return [drafter._picked(drafter._pick(tail, ids, logits)), drafter._picked(graphed)]


def test_a_draft_models_greedy_pick_is_the_hand_computed_one():
    """The greedy pick reads each row's last fed column: its argmax and softmax probability
    (logits log 3 on one token, 0 on three others: probability 1/2), eager and graphed alike."""
    gen = torch.Generator().manual_seed(0)
    drafter = ModelDrafter(tiny_model(seed=0), SamplingParams())
    logits = torch.full((3, 2, 6), NEG)  # [B, w, V]
    expected = [(0, 4), (1, 2), (0, 5)]  # (last fed column, its argmax) per row
    for b, (column, token) in enumerate(expected):
        logits[b, column, [t for t in range(6) if t != token][:3]] = 0.0
        logits[b, column, token] = math.log(3)
        logits[b, 1 - column, 1] = 5.0  # the other column's argmax: wrong if it were read
    last = torch.tensor([column for column, _ in expected])
    ids = torch.zeros(3, 2, dtype=torch.long)
    for token, p, top in picks(drafter, drafter._tail(None, [2] * 3, 0, last.tolist()), ids, logits, last, gen):
        assert token.tolist() == [t for _, t in expected] and p is None
        assert torch.allclose(top, torch.full((3,), 0.5), atol=1e-6)


def test_a_draft_models_sampled_pick_is_the_hand_computed_one():
    """Sampled, a drafting row draws its token from its own stream for this position (what
    `sample` draws from it) out of the distribution worked out by hand, and a row past its γ
    takes the argmax: eager and graphed alike, and both tokens of a two-token distribution come."""
    from specpipe.sampling import DRAFT, RowRandom, sample
    from specpipe.types import Rows

    gen = torch.Generator().manual_seed(0)
    drafter = ModelDrafter(tiny_model(seed=0), SamplingParams(temperature=1.0))
    logits = torch.full((3, 1, 5), NEG)  # [B, w, V]: 3/4 on token 1, 1/4 on token 3
    logits[:, 0, 1], logits[:, 0, 3] = math.log(0.75), math.log(0.25)
    expected = torch.tensor([0.0, 0.75, 0.0, 0.25, 0.0]).expand(3, 5)
    last, ids, gammas = torch.zeros(3, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long), [0, 3, 6]
    drawn = set()
    for position in range(5):
        rows = Rows([[1]] * 3, [RowRandom(seed=seed, step=position) for seed in (5, 6, 7)], lambda i: 0.0, "cpu")
        tail = drafter._tail(rows, gammas, position, [0] * 3)
        for token, p, top in picks(drafter, tail, ids, logits, last, gen):
            assert torch.allclose(p, expected) and torch.allclose(top, torch.full((3,), 0.75))
            for b, gamma in enumerate(gammas):
                own = sample(expected[b], rows.rngs[b](DRAFT + position, "cpu"))
                assert int(token[b]) == (int(own) if position < gamma else 1)
                drawn |= {int(token[b])} if position < gamma else set()
    assert drawn == {1, 3}
