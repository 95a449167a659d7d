"""The rejection verifier's output distribution equals the target's, checked statistically.

Each test draws >= 50k drafts from a draft distribution, verifies them against fixed target
logits and compares the emitted tokens with the exact target distribution by a chi-square test
at a significance of 1e-6 (a correct verifier fails it once in a million seeds; the seeds are
fixed, so the test does not flake). The same statistic run on a deliberately wrong verifier
(keeping every draft token) must fail by orders of magnitude: the test has power.
"""

from __future__ import annotations

import pytest
import torch

from specpipe.sampling import RowRandom, SamplingParams, sample
from specpipe.types import DraftBlock
from specpipe.verifiers.rejection import RejectionVerifier

V = 8
DRAWS = 50_000
CHI2_CRITICAL_1E6_DF7 = 40.52  # scipy.stats.chi2.isf(1e-6, 7)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the cells the distribution can produce (others must be empty)."""
    support = probs > 0
    assert counts[~support].sum() == 0, "emitted a token the target distribution excludes"
    expected = probs[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum())


def critical(probs: torch.Tensor) -> float:
    assert int((probs > 0).sum()) == V, "critical value is for df = V - 1 = 7"
    return CHI2_CRITICAL_1E6_DF7


def logits(seed: int, rows: int, scale: float = 1.5) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * scale


def run_verifier(verifier, target_logits, draft_probs, draws: int):
    """First and second emitted token counts over `draws` verified drafts of γ = 2."""
    rng = torch.Generator().manual_seed(1234)
    first, second = torch.zeros(V), torch.zeros(V)
    drafts = sample(draft_probs.expand(draws, *draft_probs.shape), rng)  # [draws, 2]
    for i, tokens in enumerate(drafts):
        verdict = verifier.verify_row(DraftBlock(tokens, draft_probs), target_logits, RowRandom(1234, i))
        emitted = verdict.emitted
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


class KeepEverything(RejectionVerifier):
    """Deliberately wrong: emits the draft as if always accepted."""

    def verify(self, draft, target_logits, rngs):
        from specpipe.verifiers.base import chain_verdict

        bonus = target_logits.gather(1, draft.num_draft[:, None, None].expand(-1, 1, target_logits.shape[-1]))
        return chain_verdict(draft, draft.num_draft, bonus[:, 0].argmax(-1))


DRAFTS = {
    "reasonable": lambda: logits(seed=2, rows=2),
    "bad": lambda: logits(seed=0, rows=2) * -3.0,  # mass where the target has least
}


@pytest.mark.parametrize("draft", DRAFTS)
def test_emitted_tokens_follow_the_target(draft):
    sampling = SamplingParams(temperature=1.0)
    target_logits = logits(seed=0, rows=3)  # [γ+1, V]
    target_probs = sampling.probs(target_logits)
    draft_probs = sampling.probs(DRAFTS[draft]())  # [γ, V]
    first, second = run_verifier(RejectionVerifier(sampling), target_logits, draft_probs, DRAWS)
    assert chi_square(first, target_probs[0]) < critical(target_probs[0])
    if draft == "reasonable":
        # the second token is emitted only after the first was accepted; it follows row 1
        assert second.sum() > 10_000
        assert chi_square(second, target_probs[1]) < critical(target_probs[1])
    else:
        assert second.sum() < 0.2 * DRAWS  # the bad draft really is rejected most of the time
    wrong, _ = run_verifier(KeepEverything(sampling), target_logits, draft_probs, 20_000)
    assert chi_square(wrong, target_probs[0]) > 100 * critical(target_probs[0])


def test_one_hot_draft_is_lossless():
    """A model-free draft (probs=None), e.g. n-gram lookup, is treated as one-hot."""
    sampling = SamplingParams(temperature=1.0)
    target_logits = logits(seed=5, rows=2)
    target_probs = sampling.probs(target_logits)
    counts = torch.zeros(V)
    verifier = RejectionVerifier(sampling)
    for i in range(DRAWS):
        draft = DraftBlock(torch.tensor([i % 3]))  # always guesses 0, 1 or 2, no probabilities
        counts[verifier.verify_row(draft, target_logits, RowRandom(7, i)).emitted[0]] += 1
    assert chi_square(counts, target_probs[0]) < critical(target_probs[0])


@pytest.mark.full  # 110 s on 2 cores; the other distribution tests stay in CI
def test_sampling_settings_apply_to_both_distributions():
    """temperature / top-k / top-p shape target and draft alike; output follows the shaped target."""
    sampling = SamplingParams(temperature=0.7, top_k=6, top_p=0.95)
    target_logits = logits(seed=11, rows=3)
    target_probs = sampling.probs(target_logits)
    support = int((target_probs[0] > 0).sum())
    assert 1 < support < V  # truncation really removed tokens
    draft_probs = sampling.probs(logits(seed=12, rows=2))
    first, _ = run_verifier(RejectionVerifier(sampling), target_logits, draft_probs, DRAWS)
    # df = support - 1; 35.89 = scipy.stats.chi2.isf(1e-6, 5), 33.38 = isf(1e-6, 4)
    bound = {6: 35.89, 5: 33.38}[support]
    assert chi_square(first, target_probs[0]) < bound
