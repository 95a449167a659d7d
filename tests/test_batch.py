"""Batched decoding (specpipe/decode/loop.py): every row equals its request decoded alone.

Tiny float64 models, exact equality. Requests outnumber the slots, so rows finish at different
steps (EOS, each request's own max_new_tokens, a stop string) and new requests join a running
batch in the freed slots; a row that has finished never disturbs the others.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, reference_probs, tiny_model, tiny_target
from specpipe.decode.loop import Decoder, Request
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.pipeline import Pipeline
from specpipe.proposers.eagle import EagleProposer, TreeShape
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import as_lookup
from specpipe.sampling import SamplingParams
from specpipe.types import RowVerdict, StepTiming
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from test_eagle import copy_head, random_head
from test_medusa import random_heads
from test_rejection import NeighbourLogits, chi_square
from stepping import stepped

GREEDY = SamplingParams()
EOS = 1
PROMPTS = [PROMPT, [3, 60, 22], [44], [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [5, 5, 5, 5], [12, 40], [9, 9, 30, 2, 61]]
LENGTHS = [40, 7, 1, 25, 13, 2, 33]  # each request's own max_new_tokens

PROPOSERS = {
    "plain": lambda t: None,
    "ngram": lambda t: NgramProposer(ngram_max=4, ngram_min=1),
    "draft-perfect": lambda t: ModelDrafter(t.model, GREEDY),  # every token accepted, EOS inside drafts
    "draft-unrelated": lambda t: ModelDrafter(tiny_model(seed=7, layers=1), GREEDY),
    "twin-int8": lambda t: ModelDrafter(tiny_model(seed=0), GREEDY, precision="int8"),
    "medusa": lambda t: MedusaProposer(random_heads(1), GREEDY),
    "eagle-copy": lambda t: EagleProposer(copy_head(), GREEDY),
    "eagle-random": lambda t: EagleProposer(random_head(1), GREEDY),
    # suffix decoding first: rows finish and join the global tree while others still draft from it
    "eagle-suffix": lambda t: EagleProposer(random_head(1), GREEDY, lookup=as_lookup(1.0, 1)),
    "eagle-tree": lambda t: EagleProposer(copy_head(), GREEDY, TreeShape(3, 8)),  # every row a tree
    "medusa-tree": lambda t: MedusaProposer(random_heads(1), GREEDY, [[0], [1], [0, 0], [0, 1], [0, 0, 0]]),
}


def requests(stop: tuple[str, ...] = ()) -> list[Request]:
    return [Request(p, n, seed=i, stop=stop) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]


def decode(pipe: Pipeline, reqs: list[Request], concurrency: int, speculative: bool = True) -> list[list[int]]:
    tokens: dict[int, list[int]] = {i: [] for i in range(len(reqs))}
    reasons: dict[int, str] = {}
    for event in pipe.serve(reqs, concurrency=concurrency, speculative=speculative):
        assert event.index not in reasons, "a finished request emitted again"
        tokens[event.index].extend(event.tokens)
        if event.finish_reason is not None:
            reasons[event.index] = event.finish_reason
    assert len(reasons) == len(reqs)
    return [tokens[i] for i in range(len(reqs))]


@pytest.mark.parametrize("proposer", PROPOSERS)
@pytest.mark.parametrize("gamma", [1, 4])
def test_every_row_equals_its_request_alone(proposer, gamma):
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, PROPOSERS[proposer](target), GreedyVerifier(), FixedGamma(gamma))
    speculative = proposer != "plain"
    alone = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in requests()]
    assert len({len(a) for a in alone}) > 3  # rows really finish at different steps
    assert any(a and a[-1] == EOS for a in alone)  # and some by EOS
    for concurrency in (2, 3, 8):
        assert decode(pipe, requests(), concurrency, speculative) == alone, concurrency


def test_stop_strings_end_rows_where_alone_they_end():
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3))
    stop = ("w32", "w18 w49")  # one token, and a string across two
    runs = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, stop=list(stop)) for r in requests()]
    assert [run.finish_reason for run in runs].count("stop_string") >= 2
    assert decode(pipe, requests(stop), 3) == [run.token_ids for run in runs]


def test_cost_controller_in_a_batch_stays_lossless():
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), GREEDY), GreedyVerifier(),
                    CostModelGamma(3, gamma_min=0, gamma_max=6))
    alone = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in requests()]
    assert decode(pipe, requests(), 4) == alone


def test_the_hf_engine_runs_one_sequence_at_a_time_and_trees_batch():
    target = tiny_target(seed=0, eos=EOS)
    tree = Pipeline(target, PROPOSERS["eagle-tree"](target), GreedyVerifier(), FixedGamma(3))
    assert tree.batch_refusal(tree.proposer) is None and Decoder(tree, 4).slots == 4
    hf = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3), engine="hf")
    assert "hf" in hf.batch_refusal(hf.proposer)
    alone = [hf.run(r.prompt, max_new_tokens=r.max_new_tokens).token_ids for r in requests()]
    assert decode(hf, requests(), 4) == alone
    ngram = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3))
    assert ngram.batch_refusal(ngram.proposer) is None and Decoder(ngram, 4).slots == 4


def test_sampled_rows_use_their_own_generators():
    """Each row's generator is seeded by its request: a batch reproduces itself, and every row
    is what that request samples alone (float64: the batch does not move a probability)."""
    sampling = SamplingParams(temperature=1.0)
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), sampling), RejectionVerifier(sampling),
                    FixedGamma(3), sampling=sampling)
    reqs = [Request(PROMPT, 20, seed=s) for s in range(6)]
    first, again = decode(pipe, reqs, 3), decode(pipe, reqs, 4)
    assert first == again
    assert len({tuple(t) for t in first}) > 3  # different seeds, different samples
    assert first == [pipe.run(PROMPT, max_new_tokens=20, seed=s).token_ids for s in range(6)]


def test_a_batched_step_samples_the_target_distribution():
    """The rejection verifier's distribution test on batched steps: 3000 requests of two prompts
    (interleaved, so rows beside each other want different distributions), 64 at a time, each
    with its own seed; the first emitted token of each must follow the distribution that
    transformers' own forward and warpers give its prompt (top_k=8: df = 7, chi-square at
    significance 1e-6, fixed seeds). A verifier that reads another row's logits fails the same
    test by far: the test has power for the bug batching can bring."""
    sampling = SamplingParams(temperature=1.0, top_k=8)
    target = tiny_target(seed=0, eos=EOS)
    prompts = [PROMPT, [44, 3, 60]]
    with torch.no_grad():
        probs = [reference_probs(target.model(torch.tensor([p])).logits[0, -1], top_k=8) for p in prompts]  # [V] each
    reqs = [Request(prompts[s % 2], 2, seed=s) for s in range(3000)]

    def first_tokens(verifier) -> list[torch.Tensor]:
        pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), sampling), verifier, FixedGamma(2),
                        sampling=sampling)
        counts = [torch.zeros_like(p) for p in probs]
        for s, tokens in enumerate(decode(pipe, reqs, 64)):
            counts[s % 2][tokens[0]] += 1
        return counts

    for counts, p in zip(first_tokens(RejectionVerifier(sampling)), probs):
        assert chi_square(counts, p) < 40.52  # chi2.isf(1e-6, 7)
    for counts, p in zip(first_tokens(NeighbourLogits(sampling)), probs):
        assert (counts / counts.sum() - p).abs().sum() / 2 > 0.3  # total variation: far from the target


def test_cost_controller_turns_speculation_off_where_the_batch_makes_it_dear():
    """Scripted costs: at batch 1 a 5-token verify costs what a 1-token step does (memory-bound);
    at batch 8 verifying is compute-bound, k tokens cost k steps, and half the drafts fail."""
    controller = CostModelGamma(4, gamma_min=0, gamma_max=6, probe_every=1000)

    def step(batch: int, gamma: int, accepted: int) -> None:
        verify = 0.020 * (1 + 0.02 * gamma) if batch == 1 else 0.060 * (gamma + 1)
        verdicts = [RowVerdict(accepted, 0, gamma, (0,) * accepted)] * batch
        stepped(controller, list(range(len(verdicts))), verdicts, StepTiming(0.001 * gamma, verify), batch)

    for _ in range(12):
        for gamma in (1, 2, 4):
            step(1, gamma, gamma // 2)
            step(8, gamma, gamma // 2)
        step(8, 0, 0)
    assert controller.gamma(8) == 0
    assert controller.gamma(1) > 0
    controller.schedule = {1: 3, 4: 1}  # batch_schedule overrides the pick where it applies
    assert (controller.gamma(1), controller.gamma(2), controller.gamma(8)) == (3, 3, 1)
