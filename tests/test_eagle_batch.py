"""EAGLE and EAGLE-3 draft a batch's rows together: one head forward per draft depth over every
drafting row (and at most one feed of the rows the last verdict kept), chains and EAGLE-2's
trees alike, each row's greedy output plain greedy decoding's token for token (a row's tree the
one its search alone makes, node for node), a sampled row's what its request samples alone,
and the step still reads the host once. Eager and graphed targets run the same drafting body."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, VOCAB, feed
from specpipe.controllers.confidence import ConfidenceGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.decode.loop import Decoder
from specpipe.decode.syncs import reads_per_step
from specpipe.engine import FINAL, make_runner
from specpipe.heads.eagle import EagleHead, HeadCache
from specpipe.pipeline import Pipeline, Request, collect
from specpipe.drafts import NO_NODE
from specpipe.proposers.eagle import EagleProposer, TreeShape
from specpipe.proposers.eagle3 import proposer_for
from specpipe.proposers.lookup import make_lookup
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from test_dflash import target4 as bigram4
from test_eagle import SHAPE
from test_eagle3 import random_head as eagle3_head
from test_eagle3 import target4

GREEDY = SamplingParams()
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
PROMPTS = [REPEATING, PROMPT, [3, 60, 22], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]  # none ends early


def bigram_target():
    return bigram4(bigram=True)


def embed_head() -> EagleHead:
    """A head whose guess of the next feature is its row's token embedding: on `bigram_target`,
    whose layers add nothing (its features are its tokens' normed embeddings, and the LM head's
    argmax ignores the norm's scale), it drafts what the target emits, except the tokens left
    out of its draft vocabulary, which the rows' texts meet at different places: rows accept
    different counts, so the kept rows each row feeds are ragged."""
    head = EagleHead(SHAPE).double().eval()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, : SHAPE.hidden_size] = torch.eye(SHAPE.hidden_size)  # [embedding, feature] -> embedding
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    head.draft_vocab = torch.tensor([i for i in range(VOCAB) if i not in (13, 32)])
    return head


def made(head: str, sampling=GREEDY, lookup=False, tree: TreeShape | None = None):
    """(target, proposer): an EAGLE head that drafts well on a bigram target, or an EAGLE-3 head
    (random, drafting from the even ids) on a random one; chains, or EAGLE-2 trees of `tree`."""
    found = make_lookup(lookup, 1, 3, 1.0) if lookup else None
    if head == "eagle":
        return bigram_target(), EagleProposer(embed_head(), sampling, tree, lookup=found)
    return target4(), proposer_for(eagle3_head(1, torch.arange(0, VOCAB, 2)), sampling, tree, lookup=found)


def pipeline(head: str, controller=None, graphs: str = "off", sampling=GREEDY, lookup=False,
             tree: TreeShape | None = None) -> Pipeline:
    target, proposer = made(head, sampling, lookup, tree)
    verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier(sampling)
    kernels = "fast" if tree is not None and graphs == "on" else "exact"  # the static step's tree block
    return Pipeline(target, proposer, verifier, controller or FixedGamma(4), sampling=sampling,
                    runner=make_runner(target.model, graphs=graphs, kernels=kernels))


def counting_forwards(pipe: Pipeline) -> list[tuple[list[int], list[int]]]:
    """Each `propose` and `fill` call's head forwards, as the rows each forward took, with the
    step's γ per row, from now on."""
    proposer, log, calls = pipe.proposer, [], []
    forward = proposer.head.forward

    def counted(embeds, *args, **kwargs):
        calls.append(embeds.shape[0])
        return forward(embeds, *args, **kwargs)

    def watched(method):
        def call(rows, gammas):
            calls.clear()
            out = method(rows, gammas)
            log.append((list(calls), list(gammas)))
            return out
        return call

    proposer.head.forward = counted
    proposer.propose, proposer.fill = watched(proposer.propose), watched(proposer.fill)
    return log


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_batch_drafts_in_one_head_forward_per_depth(head, graphs):
    """Four rows drafting γ = 4: each step runs the head at most γ times (one feed of the kept
    rows, then a forward per further depth), each over every drafting row, where drafting row
    by row runs it γ times a row."""
    pipe = pipeline(head, graphs=graphs)
    log = counting_forwards(pipe)
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=16)
    assert [o.token_ids for o in outs] == [pipe.run(p, max_new_tokens=16, speculative=False).token_ids
                                           for p in PROMPTS]
    fills, proposals = log[0::2], log[1::2]  # each step fills, then proposes
    batched = [(forwards, gammas) for forwards, gammas in proposals if sum(g > 0 for g in gammas) == 4]
    assert len(batched) >= 3
    for forwards, gammas in batched:
        assert len(forwards) <= max(gammas), (forwards, gammas)  # the kept rows' feed, then γ - 1 depths
        assert all(rows == 4 for rows in forwards), forwards
    assert all(len(forwards) <= 1 for forwards, _ in fills)  # prompts' backlogs: every lagging row in one forward
    assert fills[0][0] == [2]  # the two prompts longer than the head's FILL_MIN rows


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_batch_searches_its_trees_in_one_head_forward_per_depth(head, graphs):
    """Four rows drafting EAGLE-2 trees of depth γ = 4: each step runs the head exactly γ times
    (one feed of the kept rows, then one forward a further depth), each over every drafting row
    (a block of k nodes a row), where a search row by row runs it γ - 1 times a row."""
    pipe = pipeline(head, graphs=graphs, tree=TreeShape(top_k=3, nodes=8))
    log = counting_forwards(pipe)
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=16)
    assert [o.token_ids for o in outs] == [pipe.run(p, max_new_tokens=16, speculative=False).token_ids
                                           for p in PROMPTS]
    batched = [(forwards, gammas) for forwards, gammas in log[1::2] if sum(g > 0 for g in gammas) == 4]
    assert len(batched) >= 3 and sum(o.stats.drafted for o in outs) > 0
    for forwards, gammas in batched:
        assert len(forwards) == max(gammas) and all(rows == 4 for rows in forwards), (forwards, gammas)


def checking_trees(proposer: EagleProposer) -> list[list[int]]:
    """From now on, each batched tree search of several rows is checked against each row's
    search alone (a batch of one, from the same root, to the row's own depth): the same tokens,
    the same parents, in the same order, and the same confidence; the rest of the row padding.
    -> each checked search's depths."""
    trees, checked = proposer._trees, []

    def compared(heads, root, depths):
        batch = trees(heads, root, depths)
        if len(heads) == 1:
            return batch
        for a, (row, depth) in enumerate(zip(heads, depths)):
            alone = trees([row], root[a : a + 1], [depth])  # [1, n]
            n = alone.width
            assert batch.tree[a, :n].tolist() == alone.tree[0].tolist(), (row, depths)
            assert batch.tokens[a, :n].tolist() == alone.tokens[0].tolist(), (row, depths)
            torch.testing.assert_close(batch.confidence[a, :n], alone.confidence[0], rtol=1e-5, atol=1e-9)
            assert (batch.tree[a, n:] == NO_NODE).all() and (batch.confidence[a, n:] == 0).all()
        checked.append(list(depths))
        return batch

    proposer._trees = compared
    return checked


def served(pipe: Pipeline, prompts: list, budgets: list[int]) -> list[list[int]]:
    """The prompts decoded together, each to its own budget (so rows near their ends draft
    shallower trees than the others): each one's tokens."""
    tokens: list[list[int]] = [[] for _ in prompts]
    for event in pipe.serve([Request(p, n) for p, n in zip(prompts, budgets)], concurrency=len(prompts)):
        tokens[event.index].extend(event.tokens)
    return tokens


TREE_BUDGETS = [24, 9, 30, 13]


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_each_rows_tree_is_the_one_its_search_alone_makes(head, graphs):
    """Rows of different lengths and budgets searched together, some to a shallower depth than
    the others: every row's tree is the one a search of that row alone makes, node for node,
    and every row's output is plain greedy's."""
    pipe = pipeline(head, graphs=graphs, tree=TreeShape(top_k=3, nodes=10))
    plain = [pipe.run(p, max_new_tokens=n, speculative=False).token_ids for p, n in zip(PROMPTS, TREE_BUDGETS)]
    checked = checking_trees(pipe.proposer)
    assert served(pipe, PROMPTS, TREE_BUDGETS) == plain
    assert len(checked) > 3 and any(len(set(depths)) > 1 for depths in checked), checked


@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_eager_and_graphed_searches_draft_the_same_trees(head):
    """The eager search and the graphed one (graphs computed eagerly on the CPU, over one
    width) draft the same trees, step for step."""
    drafts = []
    for graphs in ("off", "on"):
        pipe = pipeline(head, graphs=graphs, tree=TreeShape(top_k=2, nodes=7))
        propose, log = pipe.proposer.propose, []

        def recorded(rows, gammas, propose=propose, log=log):
            draft = propose(rows, gammas)
            log.append((draft.tokens.tolist(), draft.parents().tolist(), draft.num_draft.tolist()))
            return draft

        pipe.proposer.propose = recorded
        served(pipe, PROMPTS, TREE_BUDGETS)
        drafts.append(log)
    assert drafts[0] == drafts[1] and len(drafts[0]) > 3


@pytest.mark.slow  # the real SmolLM2 (zoo) and its shipped EAGLE head
def test_real_rows_trees_are_the_ones_their_searches_alone_make():
    """The shipped EAGLE head on SmolLM2 as an EAGLE-2 tree: four dev prompts searched together,
    each row's tree the one its search alone makes, node for node."""
    from pathlib import Path

    from specpipe.config import compose
    from specpipe.prompts import load_prompts

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m" / "eagle.yaml"
    pipe = Pipeline.from_config(compose([f"recipe={recipe}", "proposer.tree={top_k: 3, nodes: 8}",
                                         "proposer.lookup=false", "controller=fixed", "gamma=4", "guard=false"]))
    checked = checking_trees(pipe.proposer)
    served(pipe, [pipe.encode(p["messages"]) for p in load_prompts("dev")[:4]], [20, 9, 16, 12])
    assert len(checked) > 3 and any(len(set(depths)) > 1 for depths in checked), checked


@pytest.mark.parametrize("lookup", [False, "ngram"])
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_every_batched_row_equals_plain_greedy(head, rows, lookup):
    """Rows of different lengths and budgets (so of different γ near their ends), some drafted by
    a lookup beside the head's: every row's output is plain greedy decoding's, token for token,
    and drafts were made and kept."""
    pipe = pipeline(head, lookup=lookup)
    prompts = PROMPTS[:rows]
    budgets = [24, 17, 30, 21][:rows]
    plain = [pipe.run(p, max_new_tokens=n, speculative=False).token_ids for p, n in zip(prompts, budgets)]
    events = pipe.serve([Request(p, n) for p, n in zip(prompts, budgets)], concurrency=rows)
    by_row: dict[int, list] = {b: [] for b in range(rows)}
    for event in events:
        by_row[event.index].append(event)
    outs = [collect(by_row[b]) for b in range(rows)]
    assert [o.token_ids for o in outs] == plain
    assert sum(o.stats.accepted for o in outs) > 0 or head == "eagle3" and not lookup  # a random head: none kept
    assert sum(o.stats.drafted for o in outs) > 0
    alone = [pipe.run(p, max_new_tokens=n) for p, n in zip(prompts, budgets)]
    assert [o.stats.accepted_at for o in outs] == [a.stats.accepted_at for a in alone]  # the drafts alone's


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_rows_that_do_not_draft_are_left_out_of_the_heads_forwards(graphs):
    """A row decoding plainly beside drafting rows (γ = 0 every step) is in none of the head's
    forwards and its draft is empty; every row equals plain greedy."""
    pipe = pipeline("eagle", graphs=graphs)
    plain = [pipe.run(p, max_new_tokens=20, speculative=False).token_ids for p in PROMPTS]
    log = counting_forwards(pipe)
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=20, speculative=[True, False, True, True])
    assert [o.token_ids for o in outs] == plain
    assert outs[1].stats.drafted == 0 and min(outs[b].stats.accepted for b in (0, 2, 3)) > 0
    drafting = [forwards for forwards, gammas in log[1::2] if gammas[1] == 0 and sum(gammas) > 0]
    rows = [rows for forwards in drafting for rows in forwards]
    assert max(rows) == 3 and rows.count(3) > len(rows) / 2, rows  # rows finishing late leave the rest


def test_every_rows_head_cache_holds_exactly_its_committed_rows():
    """After a batch whose rows kept different counts each step (ragged feeds, padded), row b of
    the head cache equals one pass of the head over that row's committed (feature, next token)
    pairs alone: padding and drafted rows were all written past the committed ones."""
    pipe = pipeline("eagle")
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=24)
    assert len({tuple(o.stats.accepted_at) for o in outs}) > 1  # the rows kept different counts
    proposer, target = pipe.proposer, pipe.target
    for b, (prompt, out) in enumerate(zip(PROMPTS, outs)):
        tokens = prompt + out.token_ids
        features = feed(make_runner(target.model), tokens, hidden=(FINAL,)).hidden[FINAL][0]
        n = proposer.rows[b].committed
        assert 0 < n < len(tokens) - 1
        fresh = HeadCache()
        embeds = target.model.get_input_embeddings()(torch.tensor(tokens[1 : n + 1]))
        with torch.no_grad():
            proposer.head(embeds[None], features[None, :n], torch.arange(n)[None], cache=fresh)
        torch.testing.assert_close(proposer.cache.keys[b : b + 1, :, :n], fresh.keys, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(proposer.cache.values[b : b + 1, :, :n], fresh.values, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_early_stops_and_a_graphed_batch_draft_what_the_eager_batch_drafts(head, graphs):
    """The confidence controller's early stop, per row on the device: every row still equals
    plain greedy, and some chains stopped early."""
    pipe = pipeline(head, ConfidenceGamma(4, 1, 4, threshold=0.3), graphs=graphs)
    plain = [pipe.run(p, max_new_tokens=20, speculative=False).token_ids for p in PROMPTS]
    log = counting_forwards(pipe)
    assert [o.token_ids for o in pipe.generate_batch(PROMPTS, max_new_tokens=20)] == plain
    assert any(len(forwards) < max(gammas) for forwards, gammas in log if graphs == "off") or graphs == "on"


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_sampled_batched_row_draws_what_its_request_draws_alone(head, graphs):
    """A seeded request's draft draws come from its own generator for the step: a row of a
    sampled batch emits what its request emits alone with the same seed."""
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    pipe = pipeline(head, graphs=graphs, sampling=sampling)
    alone = [pipe.run(p, max_new_tokens=16, seed=3).token_ids for p in PROMPTS]
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=16, seeds=[3] * len(PROMPTS))
    assert [o.token_ids for o in outs] == alone
    assert sum(o.stats.drafted for o in outs) > 0


@pytest.mark.parametrize("lookup", [False, "ngram"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_batched_step_reads_the_host_once(head, lookup):
    """The batched chain keeps the step's one read: the verdict's copy."""
    pipe = pipeline(head, FixedGamma(3), lookup=lookup)
    counts = reads_per_step(Decoder(pipe, len(PROMPTS)), [Request(p, 12) for p in PROMPTS])
    assert len(counts) > 2 and max(counts) == 1, counts
