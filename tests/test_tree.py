"""Tree drafts: mask, positions and leaf paths on hand-built trees (parents as the draft's
device tensor); one-forward verification; KV rollback to the accepted path; Medusa in tree mode
equals plain greedy decoding."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, tiny_target, feed
from specpipe.controllers.fixed import FixedGamma
from specpipe.drafts import NO_NODE, DraftBatch, block_ancestry, block_depths, node_depths, tree_depth
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.pipeline import Pipeline, Request
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


def hand_tree(tokens=TOKENS, parents=PARENTS) -> DraftBatch:
    """A one-row tree batch of these nodes, on the host."""
    return DraftBatch.of_lists([3], [list(tokens)], [list(parents)])


def leaf_paths(parents) -> list[list[int]]:
    """Every root-to-leaf candidate of host parents, as node indices."""
    leaves = [i for i in range(len(parents)) if i not in parents]
    paths = []
    for leaf in leaves:
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def test_depths_leaf_paths_and_mask():
    tree = hand_tree()
    parents = tree.tree
    assert node_depths(parents).tolist() == [[1, 2, 2, 1, 3]] and tree_depth(parents).tolist() == [3]
    assert tree.num_draft.tolist() == [3] and block_depths(parents).tolist() == [[0, 1, 2, 2, 1, 3]]
    assert leaf_paths(PARENTS) == [[0, 2], [3], [0, 1, 4]]
    expected = torch.tensor([  # block rows: 0 = the last committed token, r = node r-1
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(block_ancestry(parents)[0], expected)


def test_a_padded_tree_batch_has_each_rows_structure():
    """Two rows of different sizes in one batch: the shorter padded with nodes that hang off
    nothing (depth 1, seeing row 0 and themselves); a chain row is the tree -1, 0, 1, ..."""
    batch = DraftBatch.of_lists([3, 3], [TOKENS, [5, 6]], [list(PARENTS), None])
    assert batch.tree.tolist() == [list(PARENTS), [-1, 0, NO_NODE, NO_NODE, NO_NODE]]
    assert batch.num_draft.tolist() == [3, 2] and batch.counts == (3, 2)
    assert block_depths(batch.tree).tolist() == [[0, 1, 2, 2, 1, 3], [0, 1, 2, 1, 1, 1]]
    seen = block_ancestry(batch.tree)
    assert torch.equal(seen[1, 3], torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.bool))  # a padding node
    assert torch.equal(seen[1, 2], torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool))


ENGINES = ["native", "hf"]


def logits_of(runner, ids, **kwargs):
    return feed(runner, ids, **kwargs).logits[0]  # [n, V]


@pytest.mark.parametrize("engine", ENGINES)
def test_one_tree_forward_equals_sequential_forwards_along_each_path(engine):
    target = tiny_target()
    runner = make_runner(target.model, engine=engine)
    feed(runner, PROMPT[:-1])
    logits = logits_of(runner, [PROMPT[-1], *TOKENS], tree=PARENTS)  # [6, V]
    for path in leaf_paths(PARENTS):
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
    tokens, parents = [(first + 1) % 64, first, (second + 3) % 64, second], (-1, -1, 1, 1)
    tree = hand_tree(tokens, parents)
    runner = make_runner(target.model, engine=engine)
    runner.prefill(0, PROMPT[:-1])
    logits = logits_of(runner, [PROMPT[-1], *tokens], tree=parents)
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
    with pytest.raises(SpecpipeError, match="verifier=rejection verifies chains, and proposer.tree drafts a tree"):
        RejectionVerifier(SamplingParams(temperature=1.0)).verify_row(hand_tree(), torch.zeros(6, 64))


REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]


def batched_trees() -> dict:
    from specpipe.proposers.eagle import EagleProposer, TreeShape
    from specpipe.proposers.suffix import RequestCache, SuffixProposer, as_lookup
    from test_eagle import copy_head, random_head

    return {
        "eagle-tree": lambda: EagleProposer(copy_head(), GREEDY, TreeShape(top_k=3, nodes=8)),
        "eagle-random-tree": lambda: EagleProposer(random_head(1), GREEDY, TreeShape(top_k=2, nodes=6)),
        # rows whose suffix lookup drafts (chains or small trees) beside rows the head's search drafts
        "eagle-suffix-tree": lambda: EagleProposer(random_head(1), GREEDY, TreeShape(top_k=3, nodes=8),
                                                   lookup=as_lookup(1.0, 1)),
        "medusa-tree": lambda: MedusaProposer(random_heads(1, scale=0.5), GREEDY, TREES["wide"]),
        "suffix-tree": lambda: SuffixProposer(RequestCache(24, 1000, 50000), max_spec_offset=2.0),
    }


def tree_steps(pipe: Pipeline) -> list[list[int]]:
    """From now on, each tree step's real node count per row (0: a row without a draft)."""
    propose, log = pipe.proposer.propose, []

    def recorded(rows, gammas):
        draft = propose(rows, gammas)
        if draft.tree is not None:
            log.append((draft.tree >= -1).sum(1).tolist())
        return draft

    pipe.proposer.propose = recorded
    return log


def served(pipe: Pipeline, requests: list) -> tuple[list[list[int]], list]:
    """The requests decoded together: each one's tokens and its last stats."""
    tokens, stats = [[] for _ in requests], [None] * len(requests)
    for event in pipe.serve(requests, concurrency=len(requests)):
        tokens[event.index].extend(event.tokens)
        stats[event.index] = event.stats
    return tokens, stats


@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: TypicalVerifier(GREEDY)], ids=["greedy", "typical"])
@pytest.mark.parametrize("proposer", ["eagle-tree", "eagle-random-tree", "eagle-suffix-tree", "medusa-tree",
                                      "suffix-tree"])
def test_batched_trees_give_every_row_plain_greedy_decoding(proposer, verifier):
    """Rows of one batch each draft their own tree (of its own size: rows near their budget draft
    shallower trees, a lookup's rows chains or small trees, rows without a draft padding alone),
    verified in one forward: every row's output is its plain greedy decoding, token for token."""
    target = tiny_target(seed=0, eos=1)
    pipe = Pipeline(target, batched_trees()[proposer](), verifier(), FixedGamma(4))
    branching = [5, 6, 7, 5, 6, 8, 5, 6, 7, 2, 5, 6, 8, 3, 5, 6]  # after 5 6: 7 or 8, a suffix tree's fork
    prompts, budgets = [PROMPT, REPEATING, [3, 60, 22], PROMPT + REPEATING, branching], [30, 24, 9, 30, 20]
    plain = [pipe.run(p, max_new_tokens=n, speculative=False).token_ids for p, n in zip(prompts, budgets)]
    steps = tree_steps(pipe)
    for _ in range(2):  # the second pass: a suffix tree's global tree holds the first's outputs
        tokens, stats = served(pipe, [Request(p, n) for p, n in zip(prompts, budgets)])
        assert tokens == plain
    assert sum(s.drafted for s in stats) > 0 and sum(s.accepted for s in stats) > 0
    together = [sizes for sizes in steps if sum(size > 0 for size in sizes) > 1]
    assert together, steps  # trees of several rows in one step
    if proposer in ("eagle-suffix-tree", "suffix-tree", "eagle-tree"):
        assert any(len({size for size in sizes if size}) > 1 for sizes in together), together  # of different sizes


def test_a_tree_on_the_hf_engine_gives_plain_greedy_decoding():
    """The hf engine (one sequence at a time) builds its tree mask and positions from the
    draft's parents tensor: a batch of requests through it equals plain greedy decoding."""
    target = tiny_target(seed=0, eos=1)
    pipe = Pipeline(target, batched_trees()["medusa-tree"](), GreedyVerifier(), FixedGamma(3), engine="hf")
    prompts = [PROMPT, REPEATING, [3, 60, 22]]
    plain = [pipe.run(p, max_new_tokens=20, speculative=False).token_ids for p in prompts]
    outs = pipe.generate_batch(prompts, max_new_tokens=20)
    assert [o.token_ids for o in outs] == plain and sum(o.stats.accepted for o in outs) > 0
