"""The decode step stays on the device: at most ONE read back to the host per step (the
verdict's copy), for every proposer that drafts on the device, chains and a tree; and the
batched verifiers' layout (ids padded with -1, num_accepted per row, rows of their own γ).

On the CPU a read is not a sync, but the same code runs on a GPU, where it is: the test counts
every Python-level call that would read a tensor back (`item`, `tolist`, `cpu`, `numpy`,
`bool()`, `int()`, `float()`, `__index__`) while a step runs."""

from __future__ import annotations


import pytest
import torch

from conftest import PROMPT, tiny_model, tiny_target
from specpipe.controllers.fixed import FixedGamma
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
from specpipe.sampling import SamplingParams
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
    prompts = [REPEATING] if proposer.endswith("tree") else [REPEATING, PROMPT, [3, 60, 22]]
    counts = counts_of(pipe, prompts)
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
    """EAGLE-2's dynamic tree searches on the device and reads its shape back once (the runner's
    mask and the verifier's walk take host parents): two reads a step on a GPU. On the CPU, where
    a read is free, the search also asks after each depth whether a deeper node could be kept."""
    target = tiny_target(seed=0)
    gamma = 3
    pipe = Pipeline(target, EagleProposer(copy_head(), GREEDY, TreeShape(top_k=2, nodes=5)), GreedyVerifier(),
                    FixedGamma(gamma), runner=make_runner(target.model, device=device))
    counts = counts_of(pipe, [REPEATING])
    assert len(counts) > 2
    assert max(counts) == 2 if device == "cuda" else 2 <= max(counts) <= 2 + (gamma - 1), counts
    assert pipe.run(REPEATING, max_new_tokens=12).stats.drafted > 0


def test_a_greedy_chain_verdict_from_the_argmax_is_the_general_chain_verdict():
    """The greedy verifier builds a chain's ids from the argmax alone (fewer launches): for
    ragged rows whose drafts match the argmax for 0 to all of their columns, its verdict is the
    one the general chain verdict builds from the kept tokens and the next one."""
    from specpipe.verifiers.base import chain_verdict, drafted, leading

    torch.manual_seed(0)
    top = torch.randint(0, 9, (5, 5))  # [B, W + 1] the target's argmax
    tokens = top[:, :4].clone()
    for row, wrong in enumerate([0, 1, 3, None, 2]):  # where each row's draft first differs
        if wrong is not None:
            tokens[row, wrong] = (top[row, wrong] + 1) % 9
    draft = DraftBatch(tokens, torch.tensor([4, 4, 4, 4, 1]), (4, 4, 4, 4, 1))
    logits = torch.nn.functional.one_hot(top, 9).float()
    verdict = GreedyVerifier().verify(draft, logits, [])
    num_accepted = leading((top[:, :4] == tokens) & drafted(draft))
    general = chain_verdict(draft, num_accepted, top.gather(1, num_accepted[:, None])[:, 0])
    assert verdict.num_accepted.tolist() == [0, 1, 3, 4, 1]
    assert torch.equal(verdict.ids, general.ids) and torch.equal(verdict.num_draft, general.num_draft)


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


def test_the_greedy_verdict_inside_the_graph_is_the_verifiers():
    """The greedy verdict a static step computes inside its graph (`chain_tail`, over the padded
    block: rows past the batch and columns past each draft hold stale ids, and padding rows
    stale counts) is, row for row, the verdict `verify` computes from the logits: the same ids,
    accepted counts and draft lengths, and the same host rows."""
    from specpipe.verifiers.greedy import chain_tail

    gen = torch.Generator().manual_seed(0)
    verifier = GreedyVerifier()
    batch, width, vocab, block, bucket = 5, 4, 7, 7, 8
    accepted = set()
    for _ in range(60):
        logits = torch.randn(bucket, block, vocab, dtype=torch.float64, generator=gen)
        counts = torch.randint(0, width + 1, (batch,), generator=gen)
        guess = torch.randint(0, vocab, (batch, width), generator=gen)
        right = torch.rand(batch, width, generator=gen) < 0.75  # most guesses the argmax: long runs
        tokens = torch.where(right, logits[:batch, :width].argmax(-1), guess)
        ids = torch.randint(0, vocab, (bucket, block), generator=gen)  # stale padding everywhere
        ids[:batch, 1 : width + 1] = tokens
        padded = torch.cat([counts, torch.randint(0, block, (bucket - batch,), generator=gen)])
        draft = DraftBatch(tokens, counts, (width,) * batch)
        eager = verifier.verify(draft, logits[:batch, : width + 1])
        graphed = verifier.verdict_of(chain_tail(logits, ids, padded)[:batch], draft)
        assert torch.equal(graphed.ids, eager.ids) and torch.equal(graphed.num_accepted, eager.num_accepted)
        assert torch.equal(graphed.num_draft, eager.num_draft) and graphed.to_host() == eager.to_host()
        accepted |= set(eager.num_accepted.tolist())
    assert accepted == set(range(width + 1))  # every outcome, none accepted to all
    for _ in range(10):  # plain steps' 1-token blocks: the argmax, nothing drafted (padding rows stale)
        logits = torch.randn(bucket, 1, vocab, dtype=torch.float64, generator=gen)
        ids = torch.randint(0, vocab, (bucket, 1), generator=gen)
        stale = torch.randint(0, block, (bucket - batch,), generator=gen)
        padded = torch.cat([torch.zeros(batch, dtype=torch.long), stale])
        draft = DraftBatch.empty(batch, "cpu")
        eager = verifier.verify(draft, logits[:batch])
        graphed = verifier.verdict_of(chain_tail(logits, ids, padded)[:batch], draft)
        assert torch.equal(graphed.ids, eager.ids) and torch.equal(graphed.num_accepted, eager.num_accepted)
        assert graphed.to_host() == eager.to_host()


@pytest.mark.parametrize("sampling", [SamplingParams(0.8), SamplingParams(1.0, top_k=5), SamplingParams(0.7, top_p=0.9)])
def test_the_rejection_verdict_inside_the_graph_is_the_verifiers(sampling):
    """The rejection verdict a static step computes inside its graph (`chain_tail` over the
    padded block, its draws and the draft's probabilities written into buffers whose other
    entries are stale) is `verify`'s, row for row: the same draws from the
    same streams, so the same accepted counts and the same recovered or bonus tokens, with the
    draft's probabilities and one-hot alike."""
    from specpipe.sampling import RowRandom

    gen = torch.Generator().manual_seed(0)
    verifier = RejectionVerifier(sampling)
    batch, width, vocab, bucket = 3, 4, 11, 4
    accepted = set()
    for trial in range(40):
        block = 6 if trial % 3 else width + 1  # at width + 1, a row asked for more than fits (fast's padding)
        logits = torch.randn(bucket, block, vocab, generator=gen) * 2
        counts = torch.randint(0, width + 1, (batch,), generator=gen)
        gammas = tuple(int(c) + int(torch.randint(0, 3, (1,), generator=gen)) for c in counts)  # drafted fewer
        tokens = torch.multinomial(sampling.probs(logits[:batch, :width]).view(-1, vocab), 1,
                                   generator=gen).view(batch, width)  # likely tokens: long runs
        probs = None if trial % 2 else torch.softmax(torch.randn(batch, width, vocab, generator=gen), -1)
        draft = DraftBatch(tokens, counts, gammas, probs)
        rngs = [RowRandom(seed=trial * 7 + b, step=trial) for b in range(batch)]
        eager = verifier.verify(draft, logits[:batch, : width + 1], rngs)
        ids = torch.randint(0, vocab, (bucket, block), generator=gen)  # stale padding everywhere
        ids[:batch, 1 : width + 1] = tokens
        padded = torch.cat([counts, torch.randint(0, block, (bucket - batch,), generator=gen)])
        tail = verifier.tail(draft, rngs)
        buffers = [torch.rand((bucket, *size), generator=gen) + 0.5 for size in tail.inputs.sizes(block, vocab)]
        tail.inputs.fill(buffers)
        graphed = verifier.verdict_of(tail.compute(logits, ids, padded, *buffers)[:batch], draft)
        assert torch.equal(graphed.ids, eager.ids) and torch.equal(graphed.num_accepted, eager.num_accepted)
        assert graphed.to_host() == eager.to_host()
        accepted |= set(eager.num_accepted.tolist())
    assert accepted == set(range(width + 1))


def test_a_draft_models_pick_inside_its_graph_is_the_eager_pick():
    """A draft model's greedy pick as its static step's tail (`greedy_pick`: each row's last fed
    column of the padded block, stale padding rows included) is the eager pick's token and
    probability, bit for bit (the probability rides in the int64 output as its float32 bits)."""
    from specpipe.proposers.model_drafter import greedy_pick

    gen = torch.Generator().manual_seed(0)
    drafter = ModelDrafter(tiny_model(seed=0), SamplingParams())
    batch, block, vocab, bucket = 3, 2, 50, 4
    for _ in range(20):
        logits = torch.randn(bucket, block, vocab, generator=gen) * 4
        last = torch.randint(0, block, (batch,), generator=gen)
        counts = torch.cat([last, torch.randint(0, 9, (bucket - batch,), generator=gen)])  # stale: out of range too
        out = greedy_pick(logits, torch.zeros(bucket, block, dtype=torch.long), counts)[:batch]
        token, _, top = drafter._pick(logits[torch.arange(batch), last], None, [2] * batch, 0)
        assert torch.equal(out[:, 0], token) and torch.equal(out[:, 1].int().view(torch.float32), top)


def test_a_draft_models_sampled_pick_inside_its_graph_is_the_eager_pick():
    """Sampled, the pick's tail (`sampled_pick`, the race's draws written into its buffer by the
    rows' streams, ones past a row's γ) gives the eager pick's token, distribution and top
    probability, bit for bit: a drafting row samples what `_pick` samples, one past its γ
    takes the argmax."""
    from specpipe.sampling import RowRandom
    from specpipe.types import Rows

    gen = torch.Generator().manual_seed(0)
    sampling = SamplingParams(temperature=0.9, top_k=20)
    drafter = ModelDrafter(tiny_model(seed=0), sampling)
    batch, block, vocab, bucket = 3, 2, 50, 4
    sampled = set()
    for position in range(6):
        rows = Rows([[1]] * batch, [RowRandom(seed=b, step=position) for b in range(batch)], lambda i: 0.0, "cpu")
        gammas = [0, 3, 6]
        logits = torch.randn(bucket, block, vocab, generator=gen) * 2
        last = torch.randint(0, block, (batch,), generator=gen)
        counts = torch.cat([last, torch.randint(0, 9, (bucket - batch,), generator=gen)])  # stale: out of range too
        tail = drafter._tail(rows, gammas, position, last)
        buffers = [torch.rand((bucket, *size), generator=gen) for size in tail.inputs.sizes(block, vocab)]
        tail.inputs.fill(buffers)
        token, p, top = drafter._picked(tail.compute(logits, torch.zeros(bucket, block, dtype=torch.long), counts,
                                                     *buffers)[:batch])
        eager = drafter._pick(logits[torch.arange(batch), last], rows, gammas, position)
        assert torch.equal(token, eager[0]) and torch.equal(p, eager[1]) and torch.equal(top, eager[2])
        argmax = logits[torch.arange(batch), last].argmax(-1)
        sampled |= {int(token[b] != argmax[b]) for b in range(batch) if position < gammas[b]}
        assert all(token[b] == argmax[b] for b in range(batch) if position >= gammas[b])
    assert sampled == {0, 1}  # a drafting row sampled: not always the argmax
