"""The rejection verifier's output distribution equals the target's, checked statistically.

The expected distributions come from an oracle that shares no code with specpipe
(`conftest.reference_probs`: transformers' own temperature, top-k and top-p warpers). Each
test verifies tens of thousands of drafts in one batched `verify` (one row per draft, each with
its own `RowRandom`) and compares the emitted tokens with the oracle's distribution by a
chi-square test at a significance of 1e-6: a correct verifier fails a test once in a million
seeds (the seeds are fixed, so the suite does not flake). The same statistic must reject
verifiers with a realistic bug (the recovered token drawn from the target instead of the
residual, the argmax instead of a draw, another row's logits): the tests have power.
"""

from __future__ import annotations

import pytest
import torch

from conftest import reference_probs
from specpipe.drafts import DraftBatch
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.verifiers import rejection
from specpipe.verifiers.rejection import RejectionVerifier

V = 8
DRAWS = 50_000
CHI2_ISF_1E6 = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, 5: 35.89, 6: 38.26, 7: 40.52}  # scipy.stats.chi2.isf(1e-6, df)
CHI2_CRITICAL_1E6_DF7 = CHI2_ISF_1E6[7]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the cells the distribution can produce (others must be empty)."""
    support = probs > 0
    assert counts[~support].sum() == 0, "emitted a token the target distribution excludes"
    expected = probs[support].double() * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum())


def critical(probs: torch.Tensor) -> float:
    """The statistic's bound at significance 1e-6 for the cells `probs` can produce."""
    return CHI2_ISF_1E6[int((probs > 0).sum()) - 1]


def passes(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    support = probs > 0
    return bool(counts[~support].sum() == 0) and chi_square(counts, probs) < critical(probs)


def logits(seed: int, rows: int, scale: float = 1.5) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * scale


def verify_many(verifier, target_logits: torch.Tensor, draft_probs: torch.Tensor | None, seed: int = 1234,
                tokens: torch.Tensor | None = None) -> torch.Tensor:
    """One batched verify: target_logits [B, γ + 1, V], draft_probs [B, γ, V] (each row's γ
    tokens drawn from them by torch.multinomial) or None with `tokens` [B, γ] (a one-hot
    draft) -> the emitted ids [B, γ + 1] (-1 after each row's last)."""
    rows, gamma = target_logits.shape[0], target_logits.shape[1] - 1
    if tokens is None:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=generator).reshape(rows, gamma)
    draft = DraftBatch(tokens, torch.full((rows,), gamma), (gamma,) * rows, draft_probs)
    return verifier.verify(draft, target_logits, [RowRandom(seed, i) for i in range(rows)]).ids


def counts_at(ids: torch.Tensor, column: int) -> torch.Tensor:
    """[V] how often each token was emitted at `column` (rows that emitted that far)."""
    emitted = ids[:, column]
    return torch.bincount(emitted[emitted >= 0], minlength=V).double()


def first_two(verifier, target_logits, draft_probs, draws: int = DRAWS):
    """First and second emitted token counts over `draws` rows verifying drafts of γ = 2."""
    ids = verify_many(verifier, target_logits.expand(draws, -1, -1), draft_probs.expand(draws, -1, -1))
    return counts_at(ids, 0), counts_at(ids, 1)


@pytest.fixture
def wrong_residual(monkeypatch):
    """A realistic bug: the recovered token drawn from the target at the rejected position, not
    from the residual norm(max(0, target_probs - draft_probs))."""
    monkeypatch.setattr(rejection, "draft_dist", lambda tokens, probs, at, like: torch.zeros_like(like))


@pytest.fixture
def argmax(monkeypatch):
    """A realistic bug: the recovered or bonus token is the distribution's argmax, not a draw."""
    monkeypatch.setattr(rejection, "race", lambda probs, draws: probs.argmax(-1))


class NeighbourLogits(RejectionVerifier):
    """A realistic bug: row b verified against row b + 1's logits (an off-by-one row index)."""

    def verify(self, draft, target_logits, rngs):
        return super().verify(draft, target_logits.roll(-1, 0), rngs)

    def tail(self, draft, rngs):
        return None  # verified by `verify` on every runner


DRAFTS = {
    "reasonable": lambda: logits(seed=2, rows=2),
    "bad": lambda: logits(seed=0, rows=2) * -3.0,  # mass where the target has least
}


@pytest.mark.parametrize("settings", [
    dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.3), dict(temperature=2.5),
    dict(temperature=1.0, top_k=1), dict(temperature=0.7, top_k=5), dict(temperature=1.0, top_p=0.5),
    dict(temperature=0.6, top_p=0.9), dict(temperature=1.3, top_k=20, top_p=0.8), dict(temperature=0.8, top_p=0.05),
])
def test_sampling_distributions_equal_transformers_warpers(settings):
    """`SamplingParams.probs` against transformers' warpers (float64) on logits [3, 5, 64]: the
    same support and the same probabilities, to float32 rounding."""
    scores = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(8)) * 3
    got = SamplingParams(**settings).probs(scores)
    want = reference_probs(scores, **settings)
    assert got.dtype == torch.float32 and got.shape == scores.shape
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)
    if settings.get("top_k", 0) > 1 or settings.get("top_p", 1.0) < 1.0:
        assert ((want > 0).sum(-1) < 64).all()  # truncation matters here


@pytest.mark.parametrize("draft", DRAFTS)
def test_emitted_tokens_follow_the_target(draft):
    target_logits = logits(seed=0, rows=3)  # [γ + 1, V]
    target_probs = reference_probs(target_logits)
    draft_probs = reference_probs(DRAFTS[draft]()).float()  # [γ, V] what a proposer would give
    first, second = first_two(RejectionVerifier(SamplingParams(temperature=1.0)), target_logits, draft_probs)
    assert chi_square(first, target_probs[0]) < critical(target_probs[0])
    if draft == "reasonable":
        # the second token is emitted only after the first was accepted; it follows row 1
        assert second.sum() > 10_000
        assert chi_square(second, target_probs[1]) < critical(target_probs[1])
    else:
        assert second.sum() < 0.2 * DRAWS  # the bad draft really is rejected most of the time


@pytest.mark.parametrize("bug", ["wrong_residual", "argmax"])
def test_a_realistic_bug_fails_the_distribution_test(request, bug):
    """The statistic above, on verifiers with one realistic bug each, 20k draws: far outside."""
    request.getfixturevalue(bug)
    target_logits = logits(seed=0, rows=3)
    target_probs = reference_probs(target_logits)
    draft_probs = reference_probs(DRAFTS["reasonable"]()).float()
    first, _ = first_two(RejectionVerifier(SamplingParams(temperature=1.0)), target_logits, draft_probs, 20_000)
    assert chi_square(first, target_probs[0]) > 10 * critical(target_probs[0])


def test_one_hot_draft_is_lossless():
    """A model-free draft (probs=None), e.g. n-gram lookup, is treated as one-hot."""
    target_logits = logits(seed=5, rows=2)
    target_probs = reference_probs(target_logits)
    tokens = torch.arange(DRAWS)[:, None] % 3  # always guesses 0, 1 or 2, no probabilities
    ids = verify_many(RejectionVerifier(SamplingParams(temperature=1.0)), target_logits.expand(DRAWS, -1, -1),
                      None, seed=7, tokens=tokens)
    assert chi_square(counts_at(ids, 0), target_probs[0]) < critical(target_probs[0])


def test_temperature_top_k_and_top_p_shape_target_and_draft():
    """temperature / top-k / top-p shape target and draft alike; the output follows the target
    as transformers' warpers shape it, at both emitted positions. The same draws against the
    unshaped target (a sampling step left out) fail."""
    settings = dict(temperature=0.7, top_k=5, top_p=0.9)  # here each step removes tokens the other keeps
    target_logits = logits(seed=12, rows=3)
    target_probs = reference_probs(target_logits, **settings)
    assert 1 < int((target_probs[0] > 0).sum()) < V - 1  # truncation really removed tokens
    draft_probs = reference_probs(logits(seed=13, rows=2), **settings).float()
    first, second = first_two(RejectionVerifier(SamplingParams(**settings)), target_logits, draft_probs)
    assert chi_square(first, target_probs[0]) < critical(target_probs[0])
    assert second.sum() > 4_000 and chi_square(second, target_probs[1]) < critical(target_probs[1])
    for unshaped in (dict(temperature=1.0, top_k=5, top_p=0.9), dict(temperature=0.7, top_k=5),
                     dict(temperature=0.7, top_p=0.9)):
        assert not passes(first, reference_probs(target_logits, **unshaped)[0]), unshaped


def test_every_row_is_verified_against_its_own_logits():
    """Rows of one batch with different targets and drafts (two kinds, interleaved): each row's
    output follows its own target. A verifier that reads the next row's logits fails."""
    kinds = [(logits(seed=20, rows=3), reference_probs(logits(seed=21, rows=2)).float()),
             (logits(seed=22, rows=3) * -1, reference_probs(logits(seed=23, rows=2)).float())]
    draws = 20_000
    target_logits = torch.stack([kinds[i % 2][0] for i in range(draws)])  # [B, 3, V]
    draft_probs = torch.stack([kinds[i % 2][1] for i in range(draws)])

    def outputs(verifier):
        ids = verify_many(verifier, target_logits, draft_probs)
        return [counts_at(ids[kind::2], 0) for kind in (0, 1)]

    sampling = SamplingParams(temperature=1.0)
    for kind, counts in enumerate(outputs(RejectionVerifier(sampling))):
        target_probs = reference_probs(kinds[kind][0])[0]
        assert chi_square(counts, target_probs) < critical(target_probs), kind
    for kind, counts in enumerate(outputs(NeighbourLogits(sampling))):
        target_probs = reference_probs(kinds[kind][0])[0]
        assert chi_square(counts, target_probs) > 10 * critical(target_probs), kind


def test_a_row_alone_is_the_row_in_a_batch():
    """verify_row (a batch of one) and the batched verify agree row by row: a row's draws come
    from its own stream whatever rows sit beside it."""
    target_logits = logits(seed=0, rows=3)
    draft_probs = reference_probs(DRAFTS["reasonable"]()).float()
    verifier = RejectionVerifier(SamplingParams(temperature=1.0))
    ids = verify_many(verifier, target_logits.expand(64, -1, -1), draft_probs.expand(64, -1, -1), seed=5)
    tokens = torch.multinomial(draft_probs.expand(64, -1, -1).reshape(-1, V), 1,
                               generator=torch.Generator().manual_seed(5)).reshape(64, 2)
    alone = [verifier.verify_row(DraftBatch(tokens[i][None], torch.tensor([2]), (2,), draft_probs[None]),
                                 target_logits, RowRandom(5, i)).emitted for i in range(64)]
    assert [[t for t in row if t >= 0] for row in ids.tolist()] == alone
    assert len({tuple(a) for a in alone}) > 4
