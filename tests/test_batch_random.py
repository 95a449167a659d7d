"""A step's random draws are ONE launch a purpose for the whole batch (vLLM's rule).

Rows whose request has no seed share the run's stream (`RunRandom`, seeded by the run's `seed`):
a draw of one purpose (a draft position, the verifier's uniforms, its recovered or bonus token)
is one launch over all of them. A request with a seed keeps a stream of its own and samples what
it samples alone, whatever rows are beside it. Draw launches are counted by a
`TorchDispatchMode` that sees every random operation torch dispatches; the shared stream's
samples are checked against the target's distribution by the rejection tests' chi-square test.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import PROMPT, reference_probs, tiny_model, tiny_target
from specpipe.controllers.fixed import FixedGamma
from specpipe.decode import step
from specpipe.decode.loop import Request
from specpipe.drafts import DraftBatch
from specpipe.pipeline import Pipeline
from specpipe.proposers.eagle import EagleProposer
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.sampling import DRAFT, RowRandom, RunRandom, SamplingParams, StepRandom
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier
from test_eagle import random_head
from test_medusa import random_heads
from test_rejection import V, chi_square, critical, logits

SAMPLED = SamplingParams(temperature=1.0)
PROMPTS = [PROMPT, [3, 60, 22], [44, 3], [7, 8, 9, 10, 7, 8]]
RANDOM = {"exponential_", "uniform_", "rand", "randn", "normal_", "random_", "multinomial", "bernoulli_"}


class Draws(TorchDispatchMode):
    """The random operations dispatched while it is on, by name (each one launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in RANDOM:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def shared(rows: int, seed: int = 5) -> StepRandom:
    """A step's randomness for `rows` rows without a seed of their own, as a decode step makes it."""
    run = RunRandom(seed)
    return StepRandom.of([RowRandom(run=run) for _ in range(rows)], advance=True)


def chain(rows: int, gamma: int, seed: int = 0) -> tuple[DraftBatch, torch.Tensor]:
    """A sampled draft of `rows` rows of γ tokens with its probabilities, and target logits [B, γ + 1, V]."""
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(rows, gamma, V, generator=generator), -1)
    tokens = torch.multinomial(probs.reshape(-1, V), 1, generator=generator).reshape(rows, gamma)
    draft = DraftBatch(tokens, torch.full((rows,), gamma), (gamma,) * rows, probs)
    return draft, torch.randn(rows, gamma + 1, V, generator=generator)


@pytest.mark.parametrize("verifier", [RejectionVerifier, TypicalVerifier])
def test_a_verify_of_four_unseeded_rows_draws_once_a_purpose(verifier):
    """Rejection sampling: one launch of uniforms and one of race draws for the four rows (typical
    acceptance: one of race draws); four seeded rows draw from four streams each."""
    draft, target_logits = chain(4, 3)
    with Draws() as draws:
        verifier(SAMPLED).verify(draft, target_logits, shared(4))
    assert sorted(draws.seen) == (["exponential_", "uniform_"] if verifier is RejectionVerifier else ["exponential_"])
    with Draws() as draws:
        verifier(SAMPLED).verify(draft, target_logits, [RowRandom(s) for s in range(4)])
    assert len(draws.seen) == 4 * (2 if verifier is RejectionVerifier else 1)


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_a_sampled_draft_of_four_unseeded_rows_draws_once_a_position(graphs):
    """The draft model (eager, and its static step's code, run eagerly on the CPU), Medusa heads
    and an EAGLE head draw one launch a draft position for four rows, as for one."""
    target = tiny_target(seed=0)
    drafter = ModelDrafter(tiny_model(seed=7, layers=1), SAMPLED, graphs=graphs)
    pipe = Pipeline(target, drafter, RejectionVerifier(SAMPLED), FixedGamma(3), sampling=SAMPLED)
    assert max(per_launch(pipe, [None] * 4)) == max(per_launch(pipe, [None])) == 3 + 2
    heads = MedusaProposer(random_heads(1), SAMPLED)  # four heads, the first γ = 3 run: three positions
    pipe = Pipeline(target, heads, RejectionVerifier(SAMPLED), FixedGamma(3), sampling=SAMPLED)
    assert max(per_launch(pipe, [None] * 4)) == max(per_launch(pipe, [None])) == 3 + 2
    eagle = EagleProposer(random_head(1), SAMPLED)  # a chain of one head forward a position for every row
    pipe = Pipeline(target, eagle, RejectionVerifier(SAMPLED), FixedGamma(3), sampling=SAMPLED)
    assert max(per_launch(pipe, [None] * 4)) == max(per_launch(pipe, [None])) == 3 + 2


def test_seeded_rows_draw_from_their_own_streams():
    """The counting has power: four seeded rows draw per row, four times what one row draws."""
    target = tiny_target(seed=0)
    pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), SAMPLED), RejectionVerifier(SAMPLED),
                    FixedGamma(3), sampling=SAMPLED)
    assert max(per_launch(pipe, [0, 1, 2, 3])) == 4 * max(per_launch(pipe, [0])) == 4 * (3 + 2)


def per_launch(pipe: Pipeline, seeds: list[int | None]) -> list[int]:
    """The random operations of each step the batch of PROMPTS (one a seed) launches."""
    counts, launch = [], step.launch

    def counted(*args):
        with Draws() as draws:
            launched = launch(*args)
        counts.append(len(draws.seen))
        return launched

    step.launch = counted
    try:
        list(pipe.serve([Request(p, 10, seed=s) for p, s in zip(PROMPTS, seeds)], concurrency=len(seeds)))
    finally:
        step.launch = launch
    return counts


@pytest.mark.parametrize("parts", ["draft-rejection", "medusa-typical"])
def test_a_seeded_row_samples_what_it_samples_alone_beside_unseeded_rows(parts):
    """Rows with a seed of their own, between rows that share the run's stream: each emits what
    its request emits alone (`run(prompt, seed=s)`), whatever the run's seed."""
    target = tiny_target(seed=0)
    if parts == "draft-rejection":
        pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), SAMPLED), RejectionVerifier(SAMPLED),
                        FixedGamma(3), sampling=SAMPLED)
    else:
        pipe = Pipeline(target, MedusaProposer(random_heads(1), SAMPLED), TypicalVerifier(SAMPLED), FixedGamma(3),
                        sampling=SAMPLED)
    seeds = [11, None, 12, None]
    alone = {s: pipe.run(p, max_new_tokens=16, seed=s).token_ids for p, s in zip(PROMPTS, seeds) if s is not None}
    for run_seed in (0, 1):
        outs = pipe.generate_batch(PROMPTS, max_new_tokens=16, seed=run_seed, seeds=seeds)
        assert {s: o.token_ids for o, s in zip(outs, seeds) if s is not None} == alone


def test_the_run_seed_reproduces_a_batch():
    """Unseeded rows are reproducible from the run's seed, and another run seed samples otherwise."""
    pipe = Pipeline(tiny_target(seed=0), ModelDrafter(tiny_model(seed=7, layers=1), SAMPLED),
                    RejectionVerifier(SAMPLED), FixedGamma(3), sampling=SAMPLED)
    def batch(seed: int) -> list[list[int]]:
        return [o.token_ids for o in pipe.generate_batch([PROMPT] * 4, max_new_tokens=16, seed=seed)]

    first = batch(3)
    assert batch(3) == first and batch(4) != first
    assert len({tuple(t) for t in first}) > 1  # one prompt four times: the rows draw different numbers


def test_the_shared_stream_keeps_the_target_distribution():
    """50,000 unseeded rows in one verify (one launch a purpose): the first and second emitted
    tokens follow the target (chi-square at significance 1e-6, as the rejection tests)."""
    rows, gamma = 50_000, 2
    target_logits = logits(seed=0, rows=gamma + 1)  # [γ + 1, V]
    target_probs = reference_probs(target_logits)
    draft_probs = reference_probs(logits(seed=2, rows=gamma)).float()  # [γ, V]
    tokens = torch.multinomial(draft_probs, rows, replacement=True, generator=torch.Generator().manual_seed(1)).T
    draft = DraftBatch(tokens.contiguous(), torch.full((rows,), gamma), (gamma,) * rows,
                       draft_probs.expand(rows, -1, -1))
    with Draws() as draws:
        ids = RejectionVerifier(SAMPLED).verify(draft, target_logits.expand(rows, -1, -1), shared(rows, seed=9)).ids
    assert len(draws.seen) == 2
    first = torch.bincount(ids[:, 0], minlength=V).double()
    second = torch.bincount(ids[:, 1][ids[:, 1] >= 0], minlength=V).double()
    assert chi_square(first, target_probs[0]) < critical(target_probs[0])
    assert second.sum() > 10_000 and chi_square(second, target_probs[1]) < critical(target_probs[1])


def test_a_seeded_rows_own_stream_is_its_own_and_an_unseeded_row_has_none():
    """`rngs[b]` is row b's own randomness: a seeded row's generator is what its request draws
    alone at that step; an unseeded row draws only in the step's shared launch."""
    run = RunRandom(2)
    rngs = StepRandom.of([RowRandom(7, step=4), RowRandom(run=run)], advance=True)
    own = torch.rand(5, generator=rngs[0](DRAFT, "cpu"))
    assert torch.equal(own, torch.rand(5, generator=RowRandom(7, step=4)(DRAFT, "cpu")))
    with pytest.raises(ValueError, match="draws through its step's StepRandom"):
        rngs[1](DRAFT, "cpu")
    assert run.step == 1 and rngs.step == 0


def test_seeds_that_do_not_match_the_prompts_are_refused():
    from specpipe.errors import SpecpipeError

    pipe = Pipeline(tiny_target(seed=0), None, RejectionVerifier(SAMPLED), None, sampling=SAMPLED)
    with pytest.raises(SpecpipeError, match="3 prompts and 2 seeds"):
        pipe.generate_batch(PROMPTS[:3], max_new_tokens=4, seeds=[1, None])
