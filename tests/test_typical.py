"""Typical acceptance (Medusa): the rule on hand-computed cases, and its lossy label."""

from __future__ import annotations


import pytest
import torch

from specpipe.drafts import DraftBatch
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.verifiers.typical import TypicalVerifier


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Rows of probabilities -> logits whose softmax (temperature 1) gives them back."""
    return torch.tensor(rows, dtype=torch.float32).log()


def test_threshold_is_min_of_epsilon_and_delta_exp_minus_entropy():
    v = TypicalVerifier(SamplingParams(temperature=1.0), epsilon=0.09, delta=0.3)
    uniform4 = torch.full((1, 4), 0.25)  # entropy ln 4: 0.3 / 4 = 0.075 < 0.09
    sure = torch.tensor([[0.97, 0.01, 0.01, 0.01]])  # entropy ~0.168: 0.3 * e^-0.168 = 0.254 > 0.09
    assert v.thresholds(uniform4).item() == pytest.approx(0.075, rel=1e-5)
    assert v.thresholds(sure).item() == pytest.approx(0.09, rel=1e-5)  # epsilon caps it
    skewed = torch.tensor([[0.5, 0.3, 0.2]])  # entropy 1.0297 nats (by hand): 0.3 * e^-1.0297 = 0.1071
    assert TypicalVerifier(SamplingParams(temperature=1.0), epsilon=0.5, delta=0.3).thresholds(skewed).item() == \
        pytest.approx(0.10713, rel=1e-3)


def test_accepts_the_plausible_prefix_and_samples_the_next_token():
    v = TypicalVerifier(SamplingParams(temperature=1.0), epsilon=0.09, delta=0.3)
    target = logits_of(
        [0.25, 0.25, 0.25, 0.25],  # threshold 0.075: token 2 (p 0.25) is plausible
        [0.6, 0.3, 0.05, 0.05],  # entropy 0.967: threshold min(0.09, 0.114) = 0.09: token 3 (p 0.05) is not
        [0.25, 0.25, 0.25, 0.25],
        [0.0, 0.0, 1.0, 0.0],  # would be the bonus row
    )
    draft = DraftBatch.of_lists([3], [[2, 3, 3]])
    verdict = v.verify_row(draft, target, RowRandom(0))
    assert verdict.n_accepted == 1 and verdict.accepted_tokens == (2,)
    # the next token is drawn from the target's row 1, one batched verify of 20k rows (each its
    # own RowRandom): chi-square against [0.6, 0.3, 0.05, 0.05] at significance 1e-6 (df 3),
    # fixed seeds; the argmax (always 0) or a draw from another row fails it by far
    rows = 20_000
    batch = DraftBatch(draft.tokens.expand(rows, -1), torch.full((rows,), 3), (3,) * rows)
    verdict = v.verify(batch, target.expand(rows, -1, -1), [RowRandom(9, i) for i in range(rows)])
    assert bool((verdict.num_accepted == 1).all())
    counts = torch.bincount(verdict.ids[:, 1], minlength=4).double()
    expected = torch.tensor([0.6, 0.3, 0.05, 0.05], dtype=torch.float64) * rows
    assert float(((counts - expected) ** 2 / expected).sum()) < 30.66  # scipy.stats.chi2.isf(1e-6, 3)


def test_all_accepted_takes_a_bonus_token_and_greedy_keeps_only_the_argmax():
    greedy = TypicalVerifier(SamplingParams(temperature=0.0))
    target = torch.tensor([[0.0, 5.0, 1.0], [4.0, 0.0, 3.9], [0.0, 0.0, 9.0]])
    assert greedy.verify_row(DraftBatch.of_lists([2], [[1, 0]]), target).emitted == [1, 0, 2]
    # 2 is nearly as likely as 0 at row 1, but greedy's distribution is one-hot: rejected
    assert greedy.verify_row(DraftBatch.of_lists([2], [[1, 2]]), target).emitted == [1, 0]
    assert not greedy.lossless


@pytest.mark.slow  # the real SmolLM2's tokenizer and config
def test_the_cli_labels_it_lossy():
    from test_cli import specpipe

    result = specpipe("check", "verifier=typical", "temperature=0.7")
    assert result.returncode == 0 and "LOSSY" in result.stdout
