"""Suffix decoding: the trees' counts, matches, drafts and memory bound, and its output equal
to plain decoding (greedy token for token, tree and chain; sampling in distribution)."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, one_row, reference_probs, tiny_target
from specpipe.controllers.fixed import FixedGamma
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from specpipe.proposers.suffix import (NODE_BYTES, RequestCache, SuffixProposer, SuffixTree, build, grow,
                                      validate_options)
from specpipe.drafts import NO_NODE
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier
from test_rejection import CHI2_CRITICAL_1E6_DF7

GREEDY = SamplingParams(temperature=0.0)
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]



class Drafted:
    """One row's draft out of a step's batch, as host lists: its tokens, and its parents (None: a chain)."""

    def __init__(self, tokens: list[int], parents: list[int] | None):
        self.tokens, self.parents = tokens, parents


def row_draft(suffix, row: int, rows, gamma: int) -> Drafted | None:
    """Row `row`'s draft in a step where it alone drafts (γ `gamma`), or None where it drafted nothing."""
    gammas = [0] * len(rows.tokens)
    gammas[row] = gamma
    batch = suffix.propose(rows, gammas)
    if batch.tree is None:
        count = int(batch.num_draft[row])
        return Drafted(batch.tokens[row, :count].tolist(), None) if count else None
    real = batch.tree[row] != NO_NODE
    return Drafted(batch.tokens[row][real].tolist(), batch.tree[row][real].tolist()) if bool(real.any()) else None


def proposer(**options):
    return build(context=None, **options)


def test_counts_follow_every_substring_up_to_the_depth():
    tree = SuffixTree(depth=3)
    tree.extend(tree.start(), [1, 2, 3, 1, 2, 4])
    node, length = tree.match([9, 1, 2])
    assert length == 2  # [9, 1, 2] was never seen; its suffix [1, 2] twice
    assert {token: tree.count[child] for token, child in tree.children[node].items()} == {3: 1, 4: 1}
    one, two = tree.children[0][1], tree.children[0][2]
    assert tree.count[one] == 2 and tree.count[two] == 2
    deepest = tree.children[tree.children[one][2]][3]  # [1, 2, 3]
    assert tree.children[deepest] == {}  # depth 3: no 4-token substrings
    assert tree.match([5]) is None


def test_a_draft_grows_most_probable_first_and_stops_at_min_token_prob():
    tree = SuffixTree(depth=8)
    tree.extend(tree.start(), [1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 4, 6])
    node, _ = tree.match([1, 2])
    speculation = grow(tree, node, limit=10, min_prob=0.3, branch=True)
    # after [1, 2]: 3 twice, 4 once -> 3, 5, 1, 2 at 2/3 each (the path seen twice), then every
    # node at 1/3: 4 and 6 (seen once), the two continuations of the second [1 2 3 5 1 2]...
    assert speculation.tokens[:4] == [3, 5, 1, 2]
    assert speculation.parents[:4] == [-1, 0, 1, 2]
    assert len(speculation.tokens) == 10
    assert 4 in speculation.tokens and speculation.parents[speculation.tokens.index(4)] == -1
    assert speculation.score == pytest.approx(4 * 2 / 3 + 6 * 1 / 3)
    chain = grow(tree, node, limit=10, min_prob=0.3, branch=False)
    assert chain.parents == list(range(-1, len(chain.tokens) - 1))  # one path: the most frequent child
    assert 4 not in chain.tokens
    assert grow(tree, node, limit=10, min_prob=0.7, branch=True).tokens == []  # nothing is that likely


def test_the_trees_are_invisible_to_the_garbage_collector():
    """Full collections would walk every node otherwise (pauses of 0.4 s measured mid-propose)."""
    import gc

    tree = SuffixTree(depth=8)
    tree.extend(tree.start(), list(range(50)) * 4)
    assert tree.nodes > 300 and not any(gc.is_tracked(children) for children in tree.children)


def test_the_global_tree_evicts_the_least_recently_used_within_its_bounds():
    cache = RequestCache(depth=4, max_requests=2, max_tokens=100)
    cache.add([1, 2, 3, 4])
    cache.add([5, 6, 7, 8])
    cache.touch(0)  # the first was used since: the second is now the least recently used
    cache.add([9, 10, 11, 12])
    assert list(cache.entries) == [0, 2]
    assert cache.tree.match([5, 6]) is None and cache.tree.match([1, 2]) is not None
    fresh = SuffixTree(4)
    for tokens in ([1, 2, 3, 4], [9, 10, 11, 12]):
        fresh.extend(fresh.start(), tokens)
    assert cache.tree.nodes == fresh.nodes  # eviction removed every node of the evicted output
    assert cache.tree.free  # ... and their slots are reused by later outputs
    by_tokens = RequestCache(depth=4, max_requests=100, max_tokens=10)
    for start in range(0, 40, 4):
        by_tokens.add(list(range(start, start + 4)))
    assert by_tokens.tokens <= 10 and by_tokens.bytes() == by_tokens.tree.nodes * NODE_BYTES
    assert by_tokens.tree.nodes <= 10 * 4  # memory: at most max_tokens × depth nodes
    assert len(by_tokens.entries) == 2  # the two latest outputs


def test_a_long_match_earns_a_long_draft():
    suffix = proposer(max_spec_factor=0.5, max_spec_offset=1.0)
    target = tiny_target()
    pipe = Pipeline(target, suffix, GreedyVerifier(), FixedGamma(16))
    prompt = list(range(2, 30)) + list(range(2, 12))  # the last 10 tokens repeat the start
    suffix.prefill(0, prompt, None)
    draft = row_draft(suffix, 0, one_row(prompt), 16)
    assert draft.tokens == list(range(12, 18))  # match 10 -> 0.5 × 10 + 1 = 6 tokens
    short = list(range(2, 30)) + [2, 3]
    suffix.prefill(0, short, None)
    assert row_draft(suffix, 0, one_row(short), 16).tokens == [4, 5]  # match 2 -> 2 tokens


def test_as_a_lookup_a_draft_is_taken_only_where_its_score_reaches_the_bar():
    """proposer.lookup=suffix: a draft whose score (expected accepted tokens) is below
    `min_score` (None: the step's γ), or that follows a match shorter than `min_match`, is not
    worth skipping the head for: None, the head drafts."""
    lookup = lambda min_score: SuffixProposer(RequestCache(24, 1000, 50000), min_score=min_score)  # noqa: E731
    prompt = list(range(2, 30)) + list(range(2, 12))  # the end repeats the start once: each next token 1/2
    strict, loose = lookup(None), lookup(2.5)
    for suffix in (strict, loose):
        suffix.prefill(0, prompt, None)
    assert strict.lookup(prompt, 6, 0) is None  # scores 6 × 1/2 = 3 < γ = 6
    assert loose.lookup(prompt, 6, 0)[0] == list(range(12, 18))  # 3 >= 2.5
    assert loose.lookup(prompt, 4, 0) is None  # 4 tokens score 2 < 2.5
    assert row_draft(loose, 0, one_row(prompt), 4).tokens == [12, 13, 14, 15]  # a proposer: any score
    longer = SuffixProposer(RequestCache(24, 1000, 50000), min_score=0.0, min_match=11)
    longer.prefill(0, prompt, None)
    assert longer.lookup(prompt, 6, 0) is None  # the text's end matches 10 tokens: fewer than min_match
    # a finished request (`release`) joins the global tree, where its text is the one continuation
    strict.release(0, prompt + list(range(12, 30)))
    asked = [50, 51, *range(2, 12)]
    strict.prefill(1, asked, None)
    assert strict.lookup(asked, 6, 1)[0] == list(range(12, 18))  # each token certain: 6 = γ


def exhaustive(suffix, row: int, committed: list[int], gamma: int, branch: bool) -> tuple[list[int], list[int]]:
    """The search by its definition, for `propose_row` to match: every match length of both
    trees (walked from the root), each grown most probable first, the highest score kept
    (ties: the local tree's, then the longer match's)."""
    def by_definition(tree, node, limit):  # the most probable offered continuation next, over and over
        tokens, parents, score, offered = [], [], 0.0, []  # offered: (probability, order, token, node, parent)
        order = iter(range(10**9))

        def offer(at, reach, index):
            ranked = sorted(tree.children[at].items(), key=lambda item: -tree.count[item[1]])  # stable
            for token, child in ranked if branch else ranked[:1]:
                if reach * tree.count[child] / tree.count[at] >= suffix.min_prob:
                    offered.append((reach * tree.count[child] / tree.count[at], next(order), token, child, index))

        offer(node, 1.0, -1)
        while offered and len(tokens) < limit:
            best_offer = max(offered, key=lambda item: (item[0], -item[1]))  # ties: the first offered
            offered.remove(best_offer)
            prob, _, token, child, parent = best_offer
            tokens.append(token)
            parents.append(parent)
            score += prob
            offer(child, prob, len(tokens) - 1)
        return tokens, parents, score

    context = committed[-suffix.cache.tree.depth:]
    best, source = ([], [], 0.0), None
    for tree in (suffix.local[row].tree, suffix.cache.tree):
        for node, length in tree.matches(context):
            limit = min(gamma, int(length * suffix.factor + suffix.offset + 1e-6))
            grown = by_definition(tree, node, limit)
            if grown[2] > best[2] or (grown[2] == best[2] and source is tree):
                best, source = grown, tree
    return best[0], best[1]


@pytest.mark.parametrize("branch", [True, False])
@pytest.mark.parametrize("options", [{}, {"max_spec_factor": 0.5, "max_spec_offset": 1.0}, {"min_token_prob": 0.0},
                                     {"max_spec_factor": 0.0, "max_spec_offset": 3.0}])
def test_the_search_drafts_what_trying_every_match_drafts(options, branch):
    """The search tries the longest match first and stops where no shorter match could score
    more (a draft scores at most its length), reads the local tree's matches off its open
    suffixes, and grows a chain without a heap: the drafts are the exhaustive search's, over
    texts that repeat at every scale and a global tree of earlier requests."""
    generator = torch.Generator().manual_seed(0)
    suffix = proposer(max_depth=8, **options)
    steps = trees = 0
    for request in range(6):
        motif = torch.randint(2, 9, (int(torch.randint(2, 7, (1,), generator=generator)),), generator=generator)
        text = torch.randint(2, 9, (5,), generator=generator).tolist()
        suffix.prefill(0, text, None)
        for _ in range(60):  # the motif, or a random token now and then
            noisy = torch.rand(1, generator=generator).item() < 0.2
            text.append(int(torch.randint(2, 9, (1,), generator=generator)) if noisy else int(motif[len(text) % len(motif)]))
            for gamma in (1, 4, 12):
                draft = row_draft(suffix, 0, one_row(text, trees=branch), gamma)
                tokens, parents = exhaustive(suffix, 0, text, gamma, branch)
                chain = None if draft is None else list(range(-1, len(draft.tokens) - 1))
                got = ([], []) if draft is None else (draft.tokens, draft.parents or chain)
                assert got == (tokens, parents), (request, len(text), gamma)
                steps += bool(tokens)
                trees += draft is not None and draft.parents is not None
        suffix.release(0, text)
    assert steps > 500 and (trees > 50) == branch, (steps, trees)  # most steps draft, many of them trees


def test_a_row_reads_the_global_tree_again_when_another_row_finishes():
    """Each row walks its suffixes in the global tree on from the last step's (a lookup a length
    a new token, 1-3 new tokens a step). Another row's request joining the tree mid-generation
    changes what the tree holds: the drafts stay the exhaustive search's at every step of both
    rows."""
    from specpipe.sampling import RowRandom
    from specpipe.types import Rows

    generator = torch.Generator().manual_seed(1)
    suffix = proposer(max_depth=6)
    motif = [3, 4, 5, 6, 2]
    texts = [[2, 3], [4, 5]]
    for row, text in enumerate(texts):
        suffix.prefill(row, text, None)
    releases = versions = 0
    for step in range(80):
        for row, text in enumerate(texts):  # 1-3 tokens a step, as a verdict commits
            for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
                noisy = torch.rand(1, generator=generator).item() < 0.15
                text.append(int(torch.randint(2, 8, (1,), generator=generator)) if noisy else motif[len(text) % len(motif)])
        rows = Rows([list(t) for t in texts], [RowRandom(0), RowRandom(1)], lambda position: 0.0,
                    torch.device("cpu"), False)
        for row, text in enumerate(texts):
            draft = row_draft(suffix, row, rows, 4)
            got = [] if draft is None else draft.tokens
            assert got == exhaustive(suffix, row, text, 4, False)[0], (step, row)
        if len(texts[1]) >= 14:  # row 1's request ends; the tree changes under row 0
            suffix.release(1, texts[1])
            texts[1] = [int(t) for t in torch.randint(2, 8, (2,), generator=generator)]
            suffix.prefill(1, texts[1], None)
            releases += 1
        versions += suffix.local[0].held_at != suffix.cache.version
    assert releases >= 10 and versions >= 10, (releases, versions)  # row 0 read the changed tree again


def test_a_finished_request_is_matched_at_once_by_a_row_mid_generation():
    """Row 0 has read the (empty) global tree; row 1's output then joins it, holding row 0's
    suffix [3, 4, 5] followed by [6, 7, 8] where [5] alone is mostly followed by 9: row 0's very
    next draft comes from that longest match, not from the suffixes it held before."""
    suffix = proposer(max_depth=6)
    suffix.prefill(0, [2, 3, 4], None)
    suffix.prefill(1, [9], None)
    assert row_draft(suffix, 0, one_row([2, 3, 4]), 4) is None  # nothing anywhere yet
    suffix.release(1, [9, 5, 9, 5, 9, 5, 9, 3, 4, 5, 6, 7, 8])
    assert row_draft(suffix, 0, one_row([2, 3, 4, 5]), 4).tokens == [6, 7, 8]
    assert exhaustive(suffix, 0, [2, 3, 4, 5], 4, False)[0] == [6, 7, 8]


VERIFIERS = {"greedy": GreedyVerifier, "typical": lambda: TypicalVerifier(GREEDY),
             "rejection": lambda: RejectionVerifier(GREEDY)}  # rejection: chains (the proposer is told)


@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("tree", [True, False])
@pytest.mark.parametrize("gamma", [1, 4, 12])
def test_greedy_equals_plain_across_requests(verifier, tree, gamma):
    target = tiny_target(seed=0, eos=1)
    plain = Pipeline(target, None, GreedyVerifier(), None)
    pipe = Pipeline(target, proposer(tree=tree, max_spec_offset=2.0), VERIFIERS[verifier](), FixedGamma(gamma))
    prompts = [PROMPT, REPEATING, [3, 60, 22], [44], PROMPT + REPEATING]
    trees = 0
    for served in range(2):  # the second pass drafts from the global tree of the first's outputs
        for prompt in prompts:
            for max_new in (1, 9, 40):
                expected = plain.run(prompt, max_new_tokens=max_new, speculative=False)
                got = pipe.run(prompt, max_new_tokens=max_new)
                assert got.token_ids == expected.token_ids, (served, prompt, max_new)
                assert got.finish_reason == expected.finish_reason
                rows = one_row(prompt + got.token_ids, trees=pipe.verifier.verifies_trees)
                trees += pipe.proposer.propose(rows, [gamma]).tree is not None
    assert pipe.proposer.cache.entries, "earlier outputs reached the global tree"
    if not tree or verifier == "rejection" or gamma == 1:
        assert trees == 0


def test_the_second_pass_of_a_repeated_workload_is_drafted_from_the_first():
    target = tiny_target(seed=0, eos=1)
    pipe = Pipeline(target, proposer(max_spec_offset=4.0), GreedyVerifier(), FixedGamma(12))
    prompts = [[3, 60, 22], [44, 5], [9, 9, 31, 2]]
    first = [pipe.run(p, max_new_tokens=48).stats for p in prompts]
    second = [pipe.run(p, max_new_tokens=48).stats for p in prompts]
    steps = lambda stats: sum(s.steps for s in stats)  # noqa: E731
    assert steps(second) * 1.5 <= steps(first), (steps(first), steps(second))
    # a repeated prompt matches the earlier request's prompt end at once: its first step drafts
    # deep into the earlier answer (the first pass starts with nothing to match)
    assert all(s.emitted_trace[0] >= 6 for s in second) and all(s.emitted_trace[0] == 1 for s in first)


def test_sampling_keeps_the_target_distribution():
    """The emitted second token's marginal over many seeds equals the target's exact marginal
    (chi-square at 1e-6 over the 7 likeliest tokens and the rest, fixed seeds)."""
    sampling = SamplingParams(temperature=0.3)
    target = tiny_target(seed=0, eos=63)
    answer = Pipeline(target, None, GreedyVerifier(), None).run([3, 60, 22], max_new_tokens=8).token_ids
    prompt = [3, 60, 22, *answer, 3, 60, 22]  # suffix drafts the greedy answer again: often kept
    pipe = Pipeline(target, proposer(), RejectionVerifier(sampling), FixedGamma(4), sampling)

    def next_probs(ids, temperature=0.3):  # [V] the target's sampling distribution after ids, by transformers alone
        with torch.no_grad():
            return reference_probs(target.model(torch.tensor([ids])).logits[0, -1], temperature=temperature)

    def cells_of(first, marginal):  # [8] the 7 likeliest second tokens, the rest and an EOS first
        return torch.cat([marginal[top], marginal[rest].sum()[None] + first[eos]])

    first = next_probs(prompt)
    eos = 63  # a first token of EOS ends the output: counted with the rest
    marginal = sum(first[t] * next_probs(prompt + [t]) for t in range(first.numel()) if t != eos)  # [V]
    draws, counts, ended, accepted = 2000, torch.zeros(first.numel()), 0, 0
    for seed in range(draws):
        generation = pipe.run(prompt, max_new_tokens=2, seed=seed)
        tokens, accepted = generation.token_ids, accepted + generation.stats.accepted
        if len(tokens) < 2:
            ended += 1
        else:
            counts[tokens[1]] += 1
    top = marginal.argsort(descending=True)[:7]
    rest = torch.ones_like(marginal, dtype=torch.bool)
    rest[top] = False
    cells = torch.cat([counts[top], counts[rest].sum()[None] + ended])
    expected = cells_of(first, marginal)
    statistic = float(((cells - expected * draws) ** 2 / (expected * draws)).sum())
    assert accepted > draws / 4  # the drafts were really verified, and often kept
    assert statistic < CHI2_CRITICAL_1E6_DF7
    # the test has power: the marginal a realistic bug gives (the temperature left out) fails it
    hot = next_probs(prompt, 1.0)
    wrong = cells_of(hot, sum(hot[t] * next_probs(prompt + [t], 1.0) for t in range(hot.numel()) if t != eos))
    assert float(((cells - wrong * draws) ** 2 / (wrong * draws)).sum()) > 10 * CHI2_CRITICAL_1E6_DF7


@pytest.mark.parametrize("options, key", [({"max_depth": 1}, "max_depth"), ({"min_token_prob": 1.5}, "min_token_prob"),
                                          ({"max_cached_tokens": -1}, "max_cached_tokens")])
def test_bad_options_are_refused_by_name(options, key):
    with pytest.raises(SpecpipeError, match=key):
        validate_options(options)
