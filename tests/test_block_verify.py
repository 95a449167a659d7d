"""Block verification (verifier=block): the emitted tokens follow the target's distribution, it
keeps at least as many draft tokens as rejection sampling, and it is greedy at temperature 0.

Target and draft are bigram models written here: the next token's logits are the row of a
[V, V] table picked by the previous token, so every row of a batch has its own context, draft
and target rows, and a step that emits one token leaves the second to a next step from it, as
decoding does. The expected distributions are computed here from the logits (softmax of
logits / temperature; top-k and top-p by hand), never with specpipe's `SamplingParams`. Each
distribution test verifies tens of thousands of drafts in one batched call and compares the
emitted tokens with the exact distribution by Pearson's chi-square at a significance of 1e-6
(the seeds are fixed, so nothing flakes; a correct verifier fails once in a million seeds).
The same statistics on deliberately wrong verifiers (rejection's per-token residual in the
block rule, a draft token judged by the next token's draft distribution, the scan stopped at the
first failed test, a row reading its neighbour's draft) must fail by a wide margin: the tests
have power.
"""

from __future__ import annotations

import functools

import pytest
import torch

from specpipe.checks.proposer import check_sampling
from specpipe.settings import resolve
from specpipe.checks.result import refuse_if_any
from specpipe.config import compose
from specpipe.decode.syncs import capture_hazards, host_reads
from specpipe.drafts import DraftBatch
from specpipe.errors import Refusal, SpecpipeError
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.verifiers import block
from specpipe.verifiers.block import BlockVerifier
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier, chain_tail

V = 8
ROWS = 40_000
CRITICAL_1E6 = {7: 40.52, 63: 131.37}  # scipy.stats.chi2.isf(1e-6, df)
CLOSE, SHARP, BAD = "close", "sharp", "bad"


def shaped(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution, written out: temperature, then the top-k logits, then the
    smallest set of most likely tokens whose mass reaches top_p, renormalised (float64)."""
    scaled = logits.double() / temperature
    if top_k:
        kth = scaled.sort(-1, descending=True).values[..., top_k - 1 : top_k]
        scaled = torch.where(scaled >= kth, scaled, -torch.inf)
    probs = torch.exp(scaled - scaled.amax(-1, keepdim=True))
    probs = probs / probs.sum(-1, keepdim=True)
    ordered, order = probs.sort(-1, descending=True)
    before = ordered.cumsum(-1) - ordered  # mass of the strictly more likely tokens
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(-1, keepdim=True)


class Bigram:
    """A target and a draft whose next-token logits depend on the previous token only."""

    def __init__(self, seed: int, draft: str, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        g = torch.Generator().manual_seed(seed)
        self.target_logits = torch.randn(V, V, generator=g)  # [previous token, next token]
        noise = torch.randn(V, V, generator=g)
        # close: the target's logits blurred, as a small draft model's are; sharp: the target at half its
        # temperature (an overconfident draft); bad: its mass where the target's is least
        self.draft_logits = {CLOSE: self.target_logits + noise, SHARP: 2 * self.target_logits,
                             BAD: -1.5 * self.target_logits + 0.5 * noise}[draft]
        self.target = shaped(self.target_logits, temperature, top_k, top_p)  # [V, V] expected, by hand
        self.draft = shaped(self.draft_logits, temperature, top_k, top_p).float()  # what a proposer would give

    def drafts(self, last: torch.Tensor, gamma: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chains of γ tokens sampled from the draft after each row's last token -> tokens [B, γ],
        their distributions [B, γ, V]."""
        g = torch.Generator().manual_seed(seed)
        tokens, probs, previous = [], [], last
        for _ in range(gamma):
            q = self.draft[previous]  # [B, V]
            previous = torch.multinomial(q, 1, generator=g)[:, 0]
            tokens.append(previous)
            probs.append(q)
        return torch.stack(tokens, 1), torch.stack(probs, 1)

    def logits(self, last: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[B, γ + 1, V]: the target's logits after the last token and after each draft token."""
        return self.target_logits[torch.cat([last[:, None], tokens], 1)]

    def joint(self, context: int) -> torch.Tensor:
        """[V * V] P(first, second) after `context`: target(context)[a] * target(a)[b]."""
        return (self.target[context][:, None] * self.target).flatten()


def verify(verifier, model: Bigram, last: torch.Tensor, gamma: int | torch.Tensor, seed: int, *,
           with_probs: bool = True):
    """One batched verify of fresh drafts after `last` [B] -> the Verdict. gamma: one γ for every
    row, or [B] each row's own (drafted to the widest, the rest padding the verifier must ignore)."""
    counts = torch.full_like(last, gamma) if isinstance(gamma, int) else gamma
    width = int(counts.max())
    tokens, probs = model.drafts(last, width, seed)
    drafted = torch.arange(width)[None] < counts[:, None]  # [B, W]
    tokens = torch.where(drafted, tokens, 0)
    probs = torch.where(drafted[..., None], probs, 0.0)
    draft = DraftBatch(tokens, counts, tuple(counts.tolist()), probs if with_probs else None,
                       counts=tuple(counts.tolist()))
    rngs = [RowRandom(seed, b) for b in range(len(last))]
    return verifier.verify(draft, model.logits(last, tokens), rngs)


def first_two(verifier, model: Bigram, last: torch.Tensor, gamma, seed: int, **kwargs) -> torch.Tensor:
    """[B, 2]: each row's first two emitted tokens; where a step emits one, a next step from it
    (fresh drafts, fresh randomness) emits the second, as decoding would."""
    verdict = verify(verifier, model, last, gamma, seed, **kwargs)
    first, second = verdict.ids[:, 0].clone(), verdict.ids[:, 1].clone()
    again = verdict.num_accepted == 0
    if isinstance(gamma, torch.Tensor):
        gamma = gamma[again]
    second[again] = verify(verifier, model, first[again], gamma, seed + 1, **kwargs).ids[:, 0]
    return torch.stack([first, second], 1)


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of token ids against probs [C] over the cells probs can produce
    (any token outside them fails at once)."""
    counts = torch.bincount(tokens, minlength=probs.shape[0]).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "emitted a token the target distribution excludes"
    expected = probs[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum())


def joint_chi_square(pairs: torch.Tensor, model: Bigram, context: int) -> float:
    return chi_square(pairs[:, 0] * V + pairs[:, 1], model.joint(context))


# deliberately wrong verifiers, each a bug a block rule invites

class PerTokenResidual(BlockVerifier):
    """Recovers from rejection sampling's residual max(0, target - draft), not the weighted one."""

    @staticmethod
    def rule(target_probs, tokens, counts, probs, uniform, draws):
        real = block._next_token
        try:
            block._next_token = lambda tp, tok, pr, weights, *rest: real(tp, tok, pr, torch.ones_like(weights), *rest)
            return block.decide(target_probs, tokens, counts, probs, uniform, draws)
        finally:
            block._next_token = real


class ProbsOfTheNextToken(BlockVerifier):
    """Judges draft token i by the distribution draft token i + 1 was drawn from (off by one)."""

    def verify(self, draft, target_logits, rngs):
        shifted = torch.cat([draft.probs[:, 1:], draft.probs[:, :1]], 1)
        return super().verify(DraftBatch(draft.tokens, draft.num_draft, draft.gammas, shifted, counts=draft.counts),
                              target_logits, rngs)


class StopsAtFirstFailure(BlockVerifier):
    """Block's tests with rejection sampling's scan: keeps the prefix before the first failed test."""

    @staticmethod
    def rule(target_probs, tokens, counts, probs, uniform, draws):
        width = tokens.shape[1]
        target_p = target_probs[:, :width].gather(-1, tokens[..., None])[..., 0]
        draft_p = probs.gather(-1, tokens[..., None])[..., 0]
        weights = block.prefix_weights(target_p, draft_p)
        mass = block.residual_mass(target_probs[:, :width], tokens, probs, weights[:, :width], target_p)
        kept = torch.arange(1, width + 1)
        passed = uniform < block.acceptance(weights, mass, counts, kept)
        num_accepted = passed.long().cumprod(1).sum(1)
        return num_accepted, block._next_token(target_probs, tokens, probs, weights, num_accepted, counts, draws)


class ReadsTheNextRow(BlockVerifier):
    """Row b is judged with row b + 1's draft distributions (a batch indexing bug)."""

    def verify(self, draft, target_logits, rngs):
        return super().verify(DraftBatch(draft.tokens, draft.num_draft, draft.gammas, draft.probs.roll(-1, 0),
                                         counts=draft.counts), target_logits, rngs)


SAMPLING = {1.0: SamplingParams(temperature=1.0), 0.7: SamplingParams(temperature=0.7)}


@pytest.mark.parametrize("draft", [CLOSE, BAD])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_first_two_tokens_follow_the_target(temperature, draft):
    """γ = 3 drafts after one context: the joint distribution of the first two emitted tokens
    (64 cells, df = 63) is the target's, and the first token alone (df = 7) too."""
    model = Bigram(seed=3, draft=draft, temperature=temperature)
    last = torch.zeros(ROWS, dtype=torch.long)
    pairs = first_two(BlockVerifier(SAMPLING[temperature]), model, last, 3, seed=11)
    assert joint_chi_square(pairs, model, 0) < CRITICAL_1E6[63]
    assert chi_square(pairs[:, 0], model.target[0]) < CRITICAL_1E6[7]


@functools.lru_cache(maxsize=None)
def sharp_pairs(verifier: type) -> tuple[Bigram, torch.Tensor]:
    """The first two tokens of 2 x ROWS γ = 3 drafts by an overconfident draft, the same drafts
    and randomness for every verifier."""
    model = Bigram(seed=3, draft=SHARP)
    return model, first_two(verifier(SAMPLING[1.0]), model, torch.zeros(2 * ROWS, dtype=torch.long), 3, seed=11)


@pytest.mark.parametrize("wrong", [PerTokenResidual, ProbsOfTheNextToken, StopsAtFirstFailure])
def test_the_distribution_test_catches_a_wrong_block_rule(wrong):
    """The joint test above, on each wrong verifier: the statistic lands far past the critical
    value (three times it: a p-value below 1e-47), while the right verifier passes it on the
    very same drafts and randomness. (Ignoring the draft's probabilities is no such bug: a one-hot draft is
    verified losslessly, only less often kept; see the one-hot test.)"""
    model, right = sharp_pairs(BlockVerifier)
    assert joint_chi_square(right, model, 0) < CRITICAL_1E6[63]
    model, pairs = sharp_pairs(wrong)
    assert joint_chi_square(pairs, model, 0) > 3 * CRITICAL_1E6[63]


def test_batch_rows_keep_their_own_context_and_draft():
    """One batch, rows from three contexts interleaved, each row with its own γ (1 to 4, so the
    block is padded past most rows' drafts): each context's rows emit its own distribution. A
    verifier that judges a row with its neighbour's draft probabilities fails the same test."""
    model = Bigram(seed=5, draft=CLOSE)
    rows = 3 * ROWS
    last = torch.arange(rows) % 3
    gamma = 1 + torch.randperm(rows, generator=torch.Generator().manual_seed(2)) % 4
    for verifier, passes in ((BlockVerifier(SAMPLING[1.0]), True), (ReadsTheNextRow(SAMPLING[1.0]), False)):
        pairs = first_two(verifier, model, last, gamma, seed=21)
        statistics = [joint_chi_square(pairs[last == c], model, c) for c in range(3)]
        if passes:
            assert max(statistics) < CRITICAL_1E6[63], statistics
        else:
            assert max(statistics) > 5 * CRITICAL_1E6[63], statistics


def test_a_draft_without_probabilities_is_one_hot_and_lossless():
    """A greedy or model-free drafter (probs=None): its tokens, here the draft's argmax chain,
    are verified as one-hot drafts, and the output is still the target's."""
    model = Bigram(seed=7, draft=CLOSE)
    model.draft = torch.nn.functional.one_hot(model.draft.argmax(-1), V).float()  # drafts the argmax
    last = torch.zeros(ROWS, dtype=torch.long)
    pairs = first_two(BlockVerifier(SAMPLING[1.0]), model, last, 4, seed=31, with_probs=False)
    assert joint_chi_square(pairs, model, 0) < CRITICAL_1E6[63]


def test_temperature_top_k_and_top_p_shape_target_and_draft():
    """temperature 0.7, top-k 6, top-p 0.9 on both: the output follows the target shaped by hand,
    and never a token the truncation removed (at either position)."""
    model = Bigram(seed=9, draft=CLOSE, temperature=0.7, top_k=6, top_p=0.9)
    cells = model.joint(0)  # [V * V] P(first, second)
    # top-p cut inside top-k: 3 tokens after the context, 12 pairs (df = 2 and 11)
    assert int((model.target[0] > 0).sum()) == 3 and int((cells > 0).sum()) == 12
    last = torch.zeros(ROWS, dtype=torch.long)
    pairs = first_two(BlockVerifier(SamplingParams(temperature=0.7, top_k=6, top_p=0.9)), model, last, 3, seed=41)
    assert chi_square(pairs[:, 0], model.target[0]) < 27.63  # scipy.stats.chi2.isf(1e-6, 2)
    assert chi_square(pairs[:, 0] * V + pairs[:, 1], cells) < 48.87  # isf(1e-6, 11)


def test_block_keeps_at_least_as_many_tokens_as_rejection_sampling():
    """Theorem 2 of the paper: on the same drafts, E[accepted] under block verification >= under
    rejection sampling, for any target and draft. Checked on 16 synthetic pairs (two seeds, a
    close and a bad draft, γ = 2 and 6, temperature 1 and 0.7): block's mean is never below
    rejection's by more than 4 standard errors, and with the close draft at γ = 6 it is above it
    by more than 4 in every case (the gain is strict wherever the per-token rule wastes mass, and
    grows with γ and the draft's quality, as the paper reports)."""
    gains = []
    for seed in (1, 2):
        for draft in (CLOSE, BAD):
            for gamma in (2, 6):
                for temperature in (1.0, 0.7):
                    model = Bigram(seed=seed, draft=draft, temperature=temperature)
                    last = torch.arange(16_000) % V  # every context
                    kept = [verify(verifier(SAMPLING[temperature]), model, last, gamma, seed=100 + gamma)
                            .num_accepted.double() for verifier in (BlockVerifier, RejectionVerifier)]
                    gain = float(kept[0].mean() - kept[1].mean())
                    error = float((kept[0].var() / len(kept[0]) + kept[1].var() / len(kept[1])).sqrt())
                    assert gain > -4 * error, (seed, draft, gamma, temperature, gain, error)
                    if gamma == 6 and draft == CLOSE:
                        gains.append(gain / error)
    assert len(gains) == 4 and min(gains) > 4, gains


def test_at_temperature_0_it_is_the_greedy_verifier():
    """One-hot target: block verification keeps exactly the argmax tokens greedy keeps, and
    emits the same next token, row by row: drafts that follow the argmax for a random number of
    tokens then stray, each row its own γ, with no probabilities, one-hot ones, or soft ones."""
    g = torch.Generator().manual_seed(4)
    rows, width, vocab = 512, 6, 50
    logits = torch.randn(rows, width + 1, vocab, generator=g) * 3
    top = logits.argmax(-1)  # [B, W + 1]
    right_for = torch.randint(0, width + 1, (rows,), generator=g)  # tokens that follow the argmax
    stray = (top[:, :width] + torch.randint(1, vocab, (rows, width), generator=g)) % vocab
    tokens = torch.where(torch.arange(width)[None] < right_for[:, None], top[:, :width], stray)
    counts = torch.randint(0, width + 1, (rows,), generator=g)
    soft = torch.softmax(torch.randn(rows, width, vocab, generator=g), -1)
    one_hot = torch.nn.functional.one_hot(tokens, vocab).float()
    greedy = SamplingParams(temperature=0.0)
    for probs in (None, one_hot, soft):
        draft = DraftBatch(tokens, counts, tuple(counts.tolist()), probs, counts=tuple(counts.tolist()))
        rngs = [RowRandom(5, b) for b in range(rows)]
        ours, theirs = BlockVerifier(greedy).verify(draft, logits, rngs), GreedyVerifier().verify(draft, logits)
        assert torch.equal(ours.num_accepted, theirs.num_accepted)
        assert torch.equal(ours.ids, theirs.ids)
    assert 0 < int(ours.num_accepted.sum()) < int(counts.sum())  # both kept some drafts and refused others


@pytest.mark.parametrize("proposer", ["draft-unrelated", "twin-int8", "ngram"])
def test_greedy_pipelines_emit_the_plain_target_tokens(proposer):
    """Through the whole step (tiny float64 target, exact equality): verifier=block at
    temperature 0 emits what plain greedy decoding emits."""
    from conftest import PROMPT, tiny_target
    from specpipe.controllers.fixed import FixedGamma
    from specpipe.pipeline import Pipeline
    from test_lossless import EOS, REPEATING, drafters, plain_reference

    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, drafters(target)[proposer](), BlockVerifier(SamplingParams()), FixedGamma(3))
    for prompt in (PROMPT, REPEATING, [44]):
        assert pipe.run(prompt, max_new_tokens=24).token_ids == plain_reference(tuple(prompt), 24).token_ids


def test_the_rule_reads_nothing_back_and_runs_inside_a_graph_capture():
    """The block verdict as a static step's tail computes it (`chain_tail` over a padded block,
    stale draft columns past each row's count) under the host-read counter and the CUDA-graph
    capture-hazard watch: neither sees anything."""
    g = torch.Generator().manual_seed(6)
    rows, block_width, vocab = 4, 6, 32
    logits = torch.randn(rows, block_width, vocab, generator=g)
    ids = torch.randint(0, vocab, (rows, block_width), generator=g)
    counts = torch.tensor([0, 2, 5, 3])
    uniform = torch.rand(rows, block_width - 1, generator=g)
    draws = torch.empty(rows, vocab).exponential_(generator=g)
    probs = torch.softmax(torch.randn(rows, block_width - 1, vocab, generator=g), -1)
    with host_reads() as reads, capture_hazards() as hazards:
        packed = chain_tail(SamplingParams(temperature=0.8), logits, ids, counts, uniform, draws, probs,
                            rule=BlockVerifier.rule)
    assert reads == [] and hazards == []
    assert packed.shape == (rows, block_width + 2) and torch.equal(packed[:, -1], counts)
    assert bool((packed[:, -2] <= counts).all())


def test_a_static_step_verifies_inside_its_graph_as_the_eager_step_does(monkeypatch):
    """With sampling, the static step runs the block verdict as its tail (`verify` is never
    called) and, seed for seed, emits what the eager step emits, one sequence or a batch."""
    from conftest import PROMPT, tiny_model, tiny_target
    from specpipe.controllers.fixed import FixedGamma
    from specpipe.engine import make_runner
    from specpipe.pipeline import Pipeline
    from specpipe.proposers.model_drafter import ModelDrafter
    from test_lossless import REPEATING

    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    target = tiny_target(seed=0)

    def pipe(graphs: str) -> Pipeline:
        return Pipeline(target, ModelDrafter(tiny_model(seed=0), sampling, graphs=graphs), BlockVerifier(sampling),
                        FixedGamma(3), sampling=sampling, runner=make_runner(target.model, graphs=graphs))

    prompts = [REPEATING, PROMPT, [3, 60, 22]]
    eager = pipe("off")
    expected = [[eager.run(p, max_new_tokens=16, seed=s).token_ids for s, p in enumerate(prompts)],
                [o.token_ids for o in eager.generate_batch(prompts, max_new_tokens=16, seed=3)]]
    monkeypatch.setattr(BlockVerifier, "verify", lambda *a: pytest.fail("verified from the logits"))
    graphed = pipe("on")
    assert [[graphed.run(p, max_new_tokens=16, seed=s).token_ids for s, p in enumerate(prompts)],
            [o.token_ids for o in graphed.generate_batch(prompts, max_new_tokens=16, seed=3)]] == expected
    assert len({tuple(t) for t in expected[0] + expected[1]}) == 6


def sampling_check(overrides: list[str]):
    cfg = compose(overrides)
    return check_sampling(cfg, resolve(cfg, fetch=False))


def test_trees_are_refused_with_the_reason():
    """A tree draft is refused by the verifier and, before anything loads, by the checks."""
    draft = DraftBatch(torch.tensor([[3, 4, 5]]), torch.tensor([2]), (2,), tree=torch.tensor([[-1, -1, 0]]))
    with pytest.raises(SpecpipeError, match="verifier=block verifies one chain") as raised:
        BlockVerifier(SAMPLING[1.0]).verify(draft, torch.zeros(1, 4, V), [RowRandom(0)])
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes/smollm2-135m/eagle3.yaml"
    cfg = compose([f"recipe={recipe}", "verifier=block", "temperature=0.7", "proposer.tree={top_k: 4, nodes: 12}"])
    check = check_sampling(cfg, resolve(cfg, fetch=False))
    assert check.status == "refuse" and "one draft chain" in check.why
    with pytest.raises(SpecpipeError, match="verifier=block verifies one chain"):
        refuse_if_any([check])
    assert str(raised.value) == str(Refusal(check.why, check.fix))  # one rule: the step says what the check says
    chain = sampling_check([f"recipe={recipe}", "verifier=block", "temperature=0.7"])
    assert chain.status == "ok" and "verifier=block honours temperature=0.7" in chain.why
    suffix = sampling_check(["model=smollm2-135m", "proposer=suffix", "verifier=block", "temperature=0.7"])
    assert suffix.status == "ok" and "drafts its best path (verifier=block verifies chains)" in suffix.why
