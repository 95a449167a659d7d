"""Tree drafts: mask, positions and leaf paths on hand-built trees; one-forward verification;
KV rollback to the accepted path; Medusa in tree mode equals plain greedy decoding."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, tiny_target, feed
from specpipe.controllers.fixed import FixedGamma
from specpipe.drafts import DraftTree
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline
from specpipe.proposers.medusa import MedusaProposer, check_tree
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier
from test_medusa import random_heads

GREEDY = SamplingParams()
#        node: 0   1   2   3   4
TOKENS = [20, 21, 22, 23, 24]
PARENTS = (-1, 0, 0, -1, 1)  # 0 -> {1 -> 4, 2}; 3


def hand_tree() -> DraftTree:
    return DraftTree(torch.tensor(TOKENS), PARENTS)


def test_depths_leaf_paths_and_mask():
    tree = hand_tree()
    assert tree.depths == [1, 2, 2, 1, 3] and tree.gamma == 3
    assert tree.leaf_paths() == [[0, 2], [3], [0, 1, 4]]
    expected = torch.tensor([  # block rows: 0 = the last committed token, r = node r-1
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.ancestry(), expected)


ENGINES = ["native", "hf"]


def logits_of(runner, ids, **kwargs):
    return feed(runner, ids, **kwargs).logits[0]  # [n, V]


@pytest.mark.parametrize("engine", ENGINES)
def test_one_tree_forward_equals_sequential_forwards_along_each_path(engine):
    target = tiny_target()
    runner = make_runner(target.model, engine=engine)
    feed(runner, PROMPT[:-1])
    tree = hand_tree()
    logits = logits_of(runner, [PROMPT[-1], *TOKENS], tree=tree.parents)  # [6, V]
    for path in tree.leaf_paths():
        fresh = logits_of(make_runner(target.model, engine=engine), PROMPT + [TOKENS[n] for n in path])[len(PROMPT) - 1:]
        rows = [0] + [n + 1 for n in path]
        assert torch.allclose(logits[rows], fresh, atol=1e-10), path


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_walk_and_kv_rollback_to_the_accepted_path(engine):
    target = tiny_target()
    plain = make_runner(target.model, engine=engine)
    first = int(logits_of(plain, PROMPT)[-1].argmax())
    second = int(logits_of(plain, [first])[-1].argmax())
    # a tree whose deep branch is the target's own greedy continuation (node 1 -> node 4)
    tree = DraftTree(torch.tensor([(first + 1) % 64, first, (second + 3) % 64, second]), (-1, -1, 1, 1))
    runner = make_runner(target.model, engine=engine)
    runner.prefill(0, PROMPT[:-1])
    logits = logits_of(runner, [PROMPT[-1], *tree.tokens.tolist()], tree=tree.parents)
    verdict = GreedyVerifier().verify_row(tree, logits)
    assert verdict.accepted_tokens == (first, second) and verdict.path == (2, 4) and verdict.last_row == 4
    runner.commit([verdict.n_accepted + 1], [verdict.path])
    tokens = PROMPT + verdict.emitted
    fresh = make_runner(target.model, engine=engine)
    feed(fresh, tokens[:-1])
    assert runner.length == fresh.length == len(tokens) - 1
    for kept, ref in zip(cached(runner), cached(fresh)):
        assert torch.allclose(kept, ref, atol=1e-10)
    # and the next forward after the rollback computes what a fresh forward does
    torch.testing.assert_close(logits_of(runner, [tokens[-1]]), logits_of(fresh, [tokens[-1]]), rtol=0, atol=1e-10)


def cached(runner) -> list[torch.Tensor]:
    """Every key and value tensor of the runner's cache, cut to its length."""
    n = runner.length
    if runner.engine == "native":  # per layer [B, kv heads, capacity, D]
        return [t[:, :, :n] for t in runner.cache.keys + runner.cache.values]
    return [t[:, :, :n] for layer in runner.cache.layers for t in (layer.keys, layer.values)]


TREES = {
    "small": [[0], [1], [0, 0], [0, 1], [0, 0, 0]],
    "wide": [[0], [1], [2], [3], [0, 0], [1, 0], [2, 0], [0, 0, 0], [0, 1], [0, 0, 0, 0]],
}


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: TypicalVerifier(GREEDY)], ids=["greedy", "typical"])
@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("heads", [0, 1])  # zero blocks (the target's own guess) or random ones
def test_medusa_tree_greedy_equals_plain(tree, verifier, gamma, heads):
    target = tiny_target()
    made = random_heads(heads, scale=0.5) if heads else random_heads(0, scale=0.0)
    plain = Pipeline(target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=40, speculative=False)
    spec = Pipeline(target, MedusaProposer(made, GREEDY, TREES[tree]), verifier(), FixedGamma(gamma))
    for _ in range(2):
        out = spec.run(PROMPT, max_new_tokens=40)
        assert out.token_ids == plain.token_ids
    assert out.stats.drafted > 0 and max(out.stats.gamma_trace) <= gamma


def test_zero_heads_in_a_tree_accept_their_top_path():
    """Zero blocks make every head repeat the target's next-token guess; the tree still runs."""
    target = tiny_target()
    spec = Pipeline(target, MedusaProposer(random_heads(0, scale=0.0), GREEDY, TREES["small"]),
                    GreedyVerifier(), FixedGamma(3))
    out = spec.run(PROMPT, max_new_tokens=30)
    assert out.stats.accepted > 0


def test_bad_trees_and_rejection_with_a_tree_are_refused():
    with pytest.raises(SpecpipeError, match=r"\[0, 1\]"):
        check_tree([[1], [0, 1]], num_heads=4)  # [0] missing
    with pytest.raises(SpecpipeError, match="at most 2 long"):
        check_tree([[0], [0, 0], [0, 0, 0]], num_heads=2)
    with pytest.raises(SpecpipeError, match="chains only"):
        RejectionVerifier(SamplingParams(temperature=1.0)).verify_row(hand_tree(), torch.zeros(6, 64))
