"""EAGLE and EAGLE-3 draft a batch's rows together: one head forward per draft depth over every
drafting row (and at most one feed of the rows the last verdict kept), each row's greedy output
plain greedy decoding's token for token, a sampled row's what its request samples alone, and
the step still reads the host once. Eager and graphed targets run the same drafting body."""

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
from specpipe.proposers.eagle import EagleProposer
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


def made(head: str, sampling=GREEDY, lookup=False):
    """(target, proposer): an EAGLE head that drafts well on a bigram target, or an EAGLE-3 head
    (random, drafting from the even ids) on a random one."""
    found = make_lookup(lookup, 1, 3, 1.0) if lookup else None
    if head == "eagle":
        return bigram_target(), EagleProposer(embed_head(), sampling, lookup=found)
    return target4(), proposer_for(eagle3_head(1, torch.arange(0, VOCAB, 2)), sampling, lookup=found)


def pipeline(head: str, controller=None, graphs: str = "off", sampling=GREEDY, lookup=False) -> Pipeline:
    target, proposer = made(head, sampling, lookup)
    verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier(sampling)
    return Pipeline(target, proposer, verifier, controller or FixedGamma(4), sampling=sampling,
                    runner=make_runner(target.model, graphs=graphs))


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
    """Each row's draft draws come from its own generator for the step: a row of a sampled batch
    emits what its request emits alone with the same seed."""
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    pipe = pipeline(head, graphs=graphs, sampling=sampling)
    alone = [pipe.run(p, max_new_tokens=16, seed=3).token_ids for p in PROMPTS]
    outs = pipe.generate_batch(PROMPTS, max_new_tokens=16, seed=3)
    assert [o.token_ids for o in outs] == alone
    assert sum(o.stats.drafted for o in outs) > 0


@pytest.mark.parametrize("lookup", [False, "ngram"])
@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_a_batched_step_reads_the_host_once(head, lookup):
    """The batched chain keeps the step's one read: the verdict's copy."""
    pipe = pipeline(head, FixedGamma(3), lookup=lookup)
    counts = reads_per_step(Decoder(pipe, len(PROMPTS)), [Request(p, 12) for p in PROMPTS])
    assert len(counts) > 2 and max(counts) == 1, counts
