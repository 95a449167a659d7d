"""Greedy output of every proposer × verifier × γ equals plain greedy decoding, token for token.

Tiny float64 models: exact equality is demanded (no near-ties to excuse). Drafts range from a
perfect one (the target itself: every token accepted, bonus tokens, EOS inside a draft) to an
unrelated random model (most tokens rejected), so every branch of the verify step runs.
"""

from __future__ import annotations

import functools

import pytest
import torch

from conftest import PROMPT, tiny_model, tiny_target
from specpipe.controllers.band import BandGamma
from specpipe.controllers.confidence import ConfidenceGamma
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.heuristic import HeuristicGamma
from specpipe.pipeline import Pipeline
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier

GREEDY = SamplingParams(temperature=0.0)
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]  # gives the ngram proposer matches from the start
EOS = 1


ENGINES = ["native", "hf"]


def drafters(target, engine: str = "native"):
    """name -> factory of a proposer for `target` (fresh per pipeline), drafting on `engine`."""
    return {
        "draft-perfect": lambda: ModelDrafter(target.model, GREEDY, engine=engine),
        "draft-unrelated": lambda: ModelDrafter(tiny_model(seed=7, layers=1), GREEDY, engine=engine),
        "twin-int8": lambda: ModelDrafter(tiny_model(seed=0), GREEDY, engine=engine, precision="int8"),
        "ngram": lambda: NgramProposer(ngram_max=4, ngram_min=1),
    }


# typical acceptance is lossy with sampling, but at temperature 0 it keeps exactly the argmax
VERIFIERS = {"greedy": GreedyVerifier, "rejection": lambda: RejectionVerifier(GREEDY),
             "typical": lambda: TypicalVerifier(GREEDY)}


def plain(target, prompt, max_new_tokens, engine: str = "native"):
    return Pipeline(target, None, GreedyVerifier(), None, engine=engine).run(
        prompt, max_new_tokens=max_new_tokens, speculative=False
    )


@functools.lru_cache(maxsize=None)
def plain_reference(prompt: tuple[int, ...], max_new_tokens: int, engine: str = "native"):
    """Plain greedy output of the default tiny target (computed once per prompt, length and engine)."""
    return plain(tiny_target(seed=0, eos=EOS), list(prompt), max_new_tokens, engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("proposer", ["draft-perfect", "draft-unrelated", "twin-int8", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_equals_plain(proposer, verifier, gamma, engine):
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, drafters(target, engine)[proposer](), VERIFIERS[verifier](), FixedGamma(gamma),
                    engine=engine)
    drafted = accepted = 0
    for prompt in (PROMPT, [3, 60, 22], [44], REPEATING):
        for max_new in (1, 2, 7, 40):
            expected = plain_reference(tuple(prompt), max_new, engine)
            got = pipe.run(prompt, max_new_tokens=max_new)
            assert got.token_ids == expected.token_ids, (prompt, max_new)
            assert got.finish_reason == expected.finish_reason
            assert got.stats.emitted == len(expected.token_ids)
            drafted, accepted = drafted + got.stats.drafted, accepted + got.stats.accepted
    # speculation really ran: drafts were verified and some kept (all of the perfect draft's, not all of
    # the unrelated one's: the rejection branch ran)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    if proposer in ("draft-perfect", "draft-unrelated"):
        assert (accepted == drafted) == (proposer == "draft-perfect"), (drafted, accepted)


@pytest.mark.parametrize("gamma", [3, 8])
def test_eos_inside_a_draft(gamma):
    """The perfect draft proposes past EOS; output must stop at EOS, as plain decoding does."""
    reference = tiny_target(seed=0, eos=EOS)
    plain_ids = plain(reference, PROMPT, 40).token_ids
    eos = plain_ids[4]  # a token plain greedy emits 5th: declare it EOS
    target = tiny_target(seed=0, eos=eos)
    expected = plain(target, PROMPT, 40)
    assert expected.token_ids == plain_ids[: plain_ids.index(eos) + 1]
    pipe = Pipeline(target, ModelDrafter(target.model, GREEDY), GreedyVerifier(), FixedGamma(gamma))
    got = pipe.run(PROMPT, max_new_tokens=40)
    assert got.token_ids == expected.token_ids
    assert got.finish_reason == "eos"
    assert got.stats.accepted + got.stats.steps > got.stats.emitted  # tokens past EOS were cut


def test_stop_string_inside_a_draft():
    target = tiny_target(seed=0, eos=EOS)
    expected_ids = plain(target, PROMPT, 40).token_ids
    stop = target.tokenizer.decode([expected_ids[3]])
    pipe = Pipeline(target, ModelDrafter(target.model, GREEDY), GreedyVerifier(), FixedGamma(8))
    got = pipe.run(PROMPT, max_new_tokens=40, stop=[stop])
    first = next(i for i, t in enumerate(expected_ids) if target.tokenizer.decode([t]) == stop)
    assert got.token_ids == expected_ids[: first + 1]
    assert got.finish_reason == "stop_string"


def test_perfect_draft_accepts_everything():
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, ModelDrafter(target.model, GREEDY), GreedyVerifier(), FixedGamma(4))
    stats = pipe.run([3, 60, 22], max_new_tokens=7).stats
    # 7 tokens at γ=4: one step of 4 accepted + bonus, then γ=min(4, 2-1)=1: accepted + bonus
    assert stats.gamma_trace == [4, 1]
    assert stats.acceptance_rate == 1.0
    assert stats.mean_accepted_length == 3.5


def test_ngram_drafts_from_the_context():
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(ngram_max=3, ngram_min=1), GreedyVerifier(), FixedGamma(4))
    got = pipe.run(REPEATING, max_new_tokens=30)
    assert got.token_ids == plain(target, REPEATING, 30).token_ids
    assert got.stats.drafted > 0 and got.stats.accepted > 0  # it found matches and the target kept some


@pytest.mark.parametrize("sizes", [(1, 3), (2, 4), (3, 3)])
def test_ngram_index_drafts_what_the_scan_drafts(sizes):
    """A row's n-gram index, grown by each step's new tokens (several at once, as a verdict
    keeps them), drafts at every step what scanning the whole text drafts."""
    generator = torch.Generator().manual_seed(1)
    lookup = NgramProposer(ngram_min=sizes[0], ngram_max=sizes[1])
    drafted = 0
    for _ in range(4):  # requests in the same row
        text = torch.randint(2, 7, (3,), generator=generator).tolist()
        lookup.prefill(0, text)
        while len(text) < 150:
            for gamma in (1, 4):
                indexed, scanned = lookup.lookup(text, gamma, row=0), lookup.lookup(text, gamma)
                assert (indexed is None) == (scanned is None) and (
                    indexed is None or indexed == scanned), len(text)  # (tokens, None) each
                drafted += indexed is not None
            text += torch.randint(2, 7, (int(torch.randint(1, 4, (1,), generator=generator)),),
                                  generator=generator).tolist()
    assert drafted > 200  # of ~600 lookups: most find a match


CONTROLLERS = {
    "heuristic": lambda: HeuristicGamma(3, gamma_min=1, gamma_max=8),
    "band": lambda: BandGamma(3, gamma_min=1, gamma_max=8, window=2),
    "confidence": lambda: ConfidenceGamma(6, gamma_min=1, gamma_max=6, threshold=0.6),
    "cost": lambda: CostModelGamma(3, gamma_min=0, gamma_max=8, probe_every=2),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("proposer", ["draft-perfect", "draft-unrelated", "ngram"])
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_adaptive_controllers_keep_greedy_output(controller, proposer, engine):
    """γ changing every step (down to 0 for the cost model) never changes the output."""
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, drafters(target, engine)[proposer](), GreedyVerifier(), CONTROLLERS[controller](),
                    engine=engine)
    traces, drafted, accepted = [], 0, 0
    for prompt in (PROMPT, REPEATING):
        got = pipe.run(prompt, max_new_tokens=40)
        assert got.token_ids == plain_reference(tuple(prompt), 40, engine).token_ids
        traces += got.stats.gamma_trace
        drafted, accepted = drafted + got.stats.drafted, accepted + got.stats.accepted
    assert len(set(traces)) > 1 or proposer == "draft-perfect"  # γ really moved
    assert drafted > 0 and accepted > 0, (drafted, accepted)  # and drafts were verified and kept
