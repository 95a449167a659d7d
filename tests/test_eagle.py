"""EAGLE: greedy output equals plain greedy decoding with random heads (chain and dynamic tree);
the head's KV cache holds exactly the committed rows after rollback; rerank; save/load; refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import PINNED, PROMPT, VOCAB, feed, reference_probs, tiny_target
from specpipe.config import compose
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import EagleHead, EagleShape, HeadCache
from specpipe.heads.io import load_eagle, save_eagle
from specpipe.engine import FINAL, make_runner
from specpipe.models.quantize import quantize_model
from specpipe.pipeline import Pipeline
from specpipe.proposers.eagle import EagleProposer, TreeShape
from specpipe.proposers.lookup import make_lookup
from specpipe.proposers.eagle_tree import rerank
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import SuffixProposer, as_lookup
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier
from test_medusa import target_dir  # noqa: F401 (fixture)
from test_rejection import CHI2_CRITICAL_1E6_DF7

GREEDY = SamplingParams()
SHAPE = EagleShape(hidden_size=32, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   intermediate_size=48, rope_theta=10000.0, rms_norm_eps=1e-6)


def test_the_heads_grouped_attention_is_sdpas_grouped_attention():
    """The head's attention folds each kv head's query heads into its rows (no `enable_gqa`,
    whose masked or fp32 form runs SDPA's math kernel on a GPU): the same attention as SDPA's
    grouped heads, masked and unmasked, one row and several."""
    import torch.nn.functional as F

    from specpipe.heads.eagle import Attention

    torch.manual_seed(0)
    attention = Attention(SHAPE)
    for n, slots in ((1, 10), (3, 10), (5, 12)):
        q = torch.randn(2, n, 4, 8).transpose(1, 2)  # [B, heads, n, d] as the projections lay it out
        k, v = torch.randn(2, 2, slots, 8), torch.randn(2, 2, slots, 8)
        mask = torch.rand(2, n, slots) > 0.3
        mask[..., 0] = True
        for m in (mask, None):
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=None if m is None else m[:, None],
                                                      enable_gqa=True)
            assert torch.allclose(attention._grouped(q, k, v, m), expected, atol=1e-6)


def random_head(seed: int, scale: float = 0.3) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(SHAPE)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, scale)
    return head.double().eval()


def copy_head() -> EagleHead:
    """fc passes the feature through and the layer adds nothing: the head guesses that the next
    feature equals this one, so drafts repeat the target's own next guess (some get accepted)."""
    head = EagleHead(SHAPE).double().eval()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, SHAPE.hidden_size:] = torch.eye(SHAPE.hidden_size)
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    return head


def run_both(target, proposer, verifier, controller, tokens: int = 40):
    plain = Pipeline(target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=tokens, speculative=False)
    spec = Pipeline(target, proposer, verifier, controller)
    outs = [spec.run(PROMPT, max_new_tokens=tokens) for _ in range(2)]  # state must not leak between runs
    return plain, outs


@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: RejectionVerifier(GREEDY), lambda: TypicalVerifier(GREEDY)])
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("head", ["random", "copy"])
def test_chain_greedy_equals_plain(verifier, gamma, head):
    target = tiny_target()
    made = random_head(1) if head == "random" else copy_head()
    plain, outs = run_both(target, EagleProposer(made, GREEDY), verifier(), FixedGamma(gamma))
    for out in outs:
        assert out.token_ids == plain.token_ids
        assert out.stats.drafted > 0 and max(out.stats.gamma_trace) == gamma


@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: TypicalVerifier(GREEDY)])
@pytest.mark.parametrize("shape", [(1, 1), (3, 12)])
@pytest.mark.parametrize("head", ["random", "copy"])
def test_tree_greedy_equals_plain(verifier, shape, head):
    target = tiny_target()
    made = random_head(2) if head == "random" else copy_head()
    proposer = EagleProposer(made, GREEDY, TreeShape(*shape))
    plain, outs = run_both(target, proposer, verifier(), FixedGamma(4))
    for out in outs:
        assert out.token_ids == plain.token_ids and out.stats.drafted > 0


@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)])
def test_a_draft_vocabulary_keeps_greedy_equal_to_plain(tree):
    """Drafting from a subset of the LM head's rows: tokens outside it are never drafted."""
    target = tiny_target()
    head = copy_head()
    head.draft_vocab = torch.arange(0, VOCAB, 2)  # even ids only
    proposer = EagleProposer(head, GREEDY, tree)
    plain, outs = run_both(target, proposer, GreedyVerifier(), FixedGamma(3))
    assert outs[0].token_ids == plain.token_ids and outs[0].stats.drafted > 0
    logits = proposer.lm(torch.randn(5, 32, dtype=torch.float64))
    assert torch.isinf(logits[:, 1::2]).all() and torch.isfinite(logits[:, ::2]).all()
    values, ids = proposer.lm.top(hidden := torch.randn(5, 32, dtype=torch.float64), 3)  # drafting's shortcut
    full = torch.log_softmax(proposer.lm(hidden), -1).topk(3)
    assert torch.equal(ids, full.indices) and torch.allclose(values, full.values)


@pytest.mark.parametrize("quantize", ["fp16", "int8"])
@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)])
def test_a_quantized_head_keeps_greedy_equal_to_plain(quantize, tree):
    """proposer.quantize packs the head's Linear layers and its draft LM-head rows (fbgemm):
    drafts change, the output must not."""
    target = tiny_target(dtype=torch.float32)
    head = quantize_model(copy_head().float(), quantize)
    head.draft_vocab = torch.arange(0, VOCAB, 2)
    proposer = EagleProposer(head, GREEDY, tree, quantize)
    assert not any(isinstance(m, torch.nn.Linear) for m in head.modules())
    plain, outs = run_both(target, proposer, GreedyVerifier(), FixedGamma(3))
    assert outs[0].token_ids == plain.token_ids and outs[0].stats.accepted > 0


def test_the_copy_head_gets_drafts_accepted():
    """Acceptance is really exercised by these tests: the copy head guesses the last token
    again, which the target confirms wherever it repeats a token."""
    target = tiny_target()
    _, outs = run_both(target, EagleProposer(copy_head(), GREEDY), GreedyVerifier(), FixedGamma(3))
    assert outs[0].stats.accepted >= 3 and max(outs[0].stats.emitted_trace) == 4


def test_with_the_cost_controller_greedy_equals_plain():
    target = tiny_target()
    proposer = EagleProposer(random_head(3), GREEDY)
    plain, outs = run_both(target, proposer, GreedyVerifier(), CostModelGamma(3, gamma_min=0, gamma_max=5))
    assert outs[0].token_ids == plain.token_ids


@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)])
def test_head_cache_holds_exactly_the_committed_rows(tree):
    """After a generation the head's cache equals one pass of the head over (true feature of
    token i, token i+1) for every committed pair: drafted rows were all rolled back."""
    target = tiny_target()
    proposer = EagleProposer(random_head(4), GREEDY, tree)
    out = Pipeline(target, proposer, GreedyVerifier(), FixedGamma(3)).run(PROMPT, max_new_tokens=30)
    tokens = PROMPT + out.token_ids
    features = feed(make_runner(target.model), tokens, hidden=(FINAL,)).hidden[FINAL][0]  # what the LM head reads
    n = proposer.rows[0].committed
    assert 0 < n < len(tokens) - 1
    fresh = HeadCache()
    embeds = target.model.get_input_embeddings()(torch.tensor(tokens[1 : n + 1]))
    with torch.no_grad():
        proposer.head(embeds[None], features[None, :n], torch.arange(n)[None], cache=fresh)
    torch.testing.assert_close(proposer.cache.keys[:1, :, :n], fresh.keys, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(proposer.cache.values[:1, :, :n], fresh.values, rtol=1e-9, atol=1e-9)


def _rerank(scores, tokens, parents, keep):
    depths = []
    for node in range(len(parents)):
        depth, up = 1, parents[node]
        while up >= 0:
            depth, up = depth + 1, parents[up]
        depths.append(depth)
    return Tree(*rerank(torch.tensor(scores), torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), keep))


class Tree:
    """A search's kept nodes (tokens, parents, confidence on the device), its parents read as a tuple."""

    def __init__(self, tokens: torch.Tensor, parents: torch.Tensor, confidence: torch.Tensor):
        self.tokens, self.parents, self.confidence = tokens, tuple(parents.tolist()), confidence


def test_rerank_keeps_the_best_nodes_as_a_closed_tree():
    #         node: 0     1     2     3     4     5
    scores = [-0.1, -1.0, -0.3, -0.2, -2.0, -0.3]
    tokens = [10, 11, 12, 13, 14, 15]
    parents = [-1, -1, 0, 0, 1, 3]
    tree = _rerank(scores, tokens, parents, 4)
    # best four: 0 (-0.1), 3 (-0.2), 2 and 5 (-0.3); parents come first, each depth by score
    assert tree.tokens.tolist() == [10, 13, 12, 15] and tree.parents == (-1, 0, 0, 1)
    tied = _rerank([0.0, 0.0, -1.0], [1, 2, 3], [-1, 0, -1], 1)  # a child tied with its parent
    assert tied.tokens.tolist() == [1] and tied.parents == (-1,)


@pytest.mark.parametrize("shape, depth", [(TreeShape(3, 8), 4), (TreeShape(2, 20), 5), (TreeShape(4, 3), 3)])
def test_the_device_search_scores_each_node_as_its_path_fed_alone(shape, depth):
    """Each kept node's confidence is its path's probability with the head fed that path one
    token at a time on the committed rows: the search's block masks, positions and ancestry
    are those of the path alone, and the kept nodes form a closed tree, parents first."""
    runner = make_runner(tiny_target().model)
    proposer = EagleProposer(random_head(6), GREEDY, shape)
    proposer.bind(runner)
    prompt = [3 + (7 * i) % (VOCAB - 3) for i in range(12)]
    proposer.prefill(0, prompt, feed(runner, prompt[:-1], hidden=(FINAL,)))  # rows (f_i, prompt[i + 1])
    state = proposer.rows[0]
    root = proposer._feed_pending([0])  # as a step does first
    keys, values = (t[:1, :, : state.committed].clone() for t in (proposer.cache.keys, proposer.cache.values))
    drafted = proposer._trees([0], root, [depth])  # row 0's tree, searched alone
    tree = Tree(drafted.tokens[0], drafted.tree[0], drafted.confidence[0])
    root = root[0]
    assert all(parent < node for node, parent in enumerate(tree.parents))
    assert len(tree.parents) == min(shape.nodes, shape.top_k + (depth - 1) * shape.top_k ** 2)
    for node in range(len(tree.parents)):
        path = [node]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        alone = HeadCache()
        alone.keys, alone.values = keys, values
        hidden, logp = root, 0.0
        for i, step in enumerate(reversed(path)):
            token = tree.tokens[step]
            logp += float(torch.log_softmax(proposer.lm.scores(hidden), -1)[token])
            position = torch.tensor([state.committed + i])
            hidden = proposer.head(proposer.target.embed(token[None])[None], hidden[None, None], position[None],
                                   None, alone)[0, -1]
        torch.testing.assert_close(float(tree.confidence[node]), float(torch.tensor(logp).exp()), rtol=1e-6, atol=1e-9)


def test_save_then_load_is_bit_exact_in_vllms_layout(tmp_path):
    head = random_head(5).float()
    head.draft_vocab = torch.tensor([3, 7, 9])
    save_eagle(head, tmp_path / "eagle", target="tiny")
    loaded = load_eagle(tmp_path / "eagle")
    assert loaded.shape == SHAPE and loaded.draft_vocab.tolist() == [3, 7, 9]
    want, got = head.state_dict(), loaded.state_dict()
    assert list(got) == list(want)  # every tensor, under its own name
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    names = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    assert names["fc.weight"].shape == (32, 64)
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.post_attention_layernorm.weight",
            "layers.0.mlp.down_proj.weight"} <= set(names)
    assert not any("input_layernorm" in n or n.startswith(("lm_head", "embed_tokens", "norm")) for n in names)
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1 and config["hidden_size"] == 32


def test_heads_that_do_not_fit_are_refused_before_generation(tmp_path, target_dir):  # noqa: F811
    narrow = EagleShape(**{**SHAPE.as_dict(), "hidden_size": 16, "head_dim": 4})
    save_eagle(EagleHead(narrow), tmp_path / "narrow", target=str(target_dir))
    save_eagle(EagleHead(SHAPE), tmp_path / "other-target", target="smollm2-135m")
    for folder, words in (("narrow", "hidden size 16"), ("other-target", "trained on smollm2-135m"),
                          ("missing", "config.json")):
        cfg = compose([f"model={target_dir}", "proposer=eagle", f"proposer.heads={tmp_path / folder}"])
        with pytest.raises(SpecpipeError, match=words):
            Pipeline.from_config(cfg)


def test_medusa_heads_given_to_eagle_are_refused(tmp_path, target_dir):  # noqa: F811
    from specpipe.heads.io import save_medusa
    from specpipe.heads.medusa import MedusaHeads

    save_medusa(MedusaHeads(32, VOCAB, 2), tmp_path / "medusa", target=str(target_dir))
    cfg = compose([f"model={target_dir}", "proposer=eagle", f"proposer.heads={tmp_path / 'medusa'}"])
    with pytest.raises(SpecpipeError, match="'medusa' heads, not eagle"):
        Pipeline.from_config(cfg)


@pytest.mark.parametrize("tree", [None, "{top_k: 3, nodes: 8}"])
def test_from_config(tmp_path, target_dir, tree):  # noqa: F811
    save_eagle(random_head(6).float(), tmp_path / "heads", target=str(target_dir))
    extra = [f"proposer.tree={tree}"] if tree else []
    cfg = compose([f"model={target_dir}", "proposer=eagle", f"proposer.heads={tmp_path / 'heads'}", "gamma=3", *extra])
    pipeline = Pipeline.from_config(cfg)
    spec = pipeline.run(PROMPT, max_new_tokens=24)
    assert spec.token_ids == pipeline.run(PROMPT, max_new_tokens=24, speculative=False).token_ids
    assert spec.stats.drafted > 0


def test_a_bad_tree_shape_is_one_clear_error(tmp_path, target_dir):  # noqa: F811
    save_eagle(random_head(7).float(), tmp_path / "heads", target=str(target_dir))
    cfg = compose([f"model={target_dir}", "proposer=eagle", f"proposer.heads={tmp_path / 'heads'}",
                   "proposer.tree={top_k: 0, nodes: 8}"])
    with pytest.raises(SpecpipeError, match="top_k >= 1"):
        Pipeline.from_config(cfg)


def test_steps_without_a_draft_keep_every_row_for_the_head():
    """γ = 0 steps (the cost controller switching speculation off, a batch schedule's 0) feed no
    head rows; their features wait with the next step's, so the head cache keeps one row per
    committed position: rows fed + rows pending = committed tokens - 1."""
    from specpipe.controllers.base import Controller

    class Alternate(Controller):
        def choose(self, batch: int) -> int:
            self._gamma = 3 - self._gamma if self._gamma in (0, 3) else 0
            return self._gamma

    target = tiny_target()
    proposer = EagleProposer(copy_head(), GREEDY)
    pipe = Pipeline(target, proposer, GreedyVerifier(), Alternate(3, gamma_min=0))
    out = pipe.run(PROMPT, max_new_tokens=30)
    assert 0 in out.stats.gamma_trace and 3 in out.stats.gamma_trace
    assert proposer.rows[0].committed + len(proposer.rows[0].pending[1]) == len(PROMPT) + len(out.token_ids) - 1
    plain = Pipeline(target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=30, speculative=False)
    assert out.token_ids == plain.token_ids


def counting(lookup):
    """`lookup` counting the drafts it found in `lookup.found` and the steps it left to the head
    in `lookup.missed` (to show a run used both sources)."""
    find = lookup.lookup

    def counted(*args, **kwargs):
        block = find(*args, **kwargs)
        lookup.found += block is not None
        lookup.missed += block is None
        return block
    lookup.found, lookup.missed, lookup.lookup = 0, 0, counted
    return lookup


MADE = {"ngram": lambda: NgramProposer(ngram_max=3, ngram_min=1),  # each lookup, as make_lookup builds it
        "suffix": lambda: make_lookup("suffix", 1, 4, lookup_score=1.0)}


@pytest.mark.parametrize("tree", [None, TreeShape(3, 8)])
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("method", MADE)
def test_lookup_before_the_head_keeps_greedy_equal_to_plain_and_the_cache_exact(tree, gamma, method):
    """proposer.lookup: steps drafted by the lookup feed the head nothing; its rows wait and
    are fed at the head's next draft, so the head cache still equals one pass over every
    committed (feature, next token) pair, and the output equals plain decoding."""
    target = tiny_target(eos=2)  # its greedy text runs the whole budget: no block accepts past a stop token
    lookup = counting(MADE[method]())
    proposer = EagleProposer(random_head(8), GREEDY, tree, lookup=lookup)
    plain, outs = run_both(target, proposer, GreedyVerifier(), FixedGamma(gamma), tokens=60)
    for out in outs:
        assert out.token_ids == plain.token_ids
    assert lookup.found > 0 and proposer.rows[0].committed > len(PROMPT) - 1  # both sources drafted
    tokens = PROMPT + outs[1].token_ids
    features = feed(make_runner(target.model), tokens, hidden=(FINAL,)).hidden[FINAL][0]
    n = proposer.rows[0].committed
    assert n + len(proposer.rows[0].pending[1]) == len(tokens) - 1
    fresh = HeadCache()
    embeds = target.model.get_input_embeddings()(torch.tensor(tokens[1 : n + 1]))
    with torch.no_grad():
        proposer.head(embeds[None], features[None, :n], torch.arange(n)[None], cache=fresh)
    torch.testing.assert_close(proposer.cache.keys[:1, :, :n], fresh.keys, rtol=1e-9, atol=1e-9)


def test_sampling_with_a_suffix_lookup_keeps_the_target_distribution():
    """Steps drafted by the suffix lookup (one-hot) and by the head (its distribution) mix in
    one generation; the emitted second token's marginal over many seeds equals the target's
    exact marginal (chi-square at 1e-6 over the 7 likeliest tokens and the rest, fixed seeds)."""
    sampling = SamplingParams(temperature=0.3)
    target = tiny_target(seed=0, eos=63)
    answer = Pipeline(target, None, GreedyVerifier(), None).run([3, 60, 22], max_new_tokens=8).token_ids
    prompt = [3, 60, 22, *answer, 3, 60, 22]  # the lookup drafts the greedy answer again: often kept
    lookup = counting(as_lookup(1.0, 1))
    proposer = EagleProposer(random_head(8), sampling, lookup=lookup)
    pipe = Pipeline(target, proposer, RejectionVerifier(sampling), FixedGamma(4), sampling)

    def next_probs(ids, temperature=0.3):  # [V] the target's sampling distribution after ids, by transformers alone
        with torch.no_grad():
            return reference_probs(target.model(torch.tensor([ids])).logits[0, -1], temperature=temperature)

    def cells_of(first, marginal):  # [8] the 7 likeliest second tokens, the rest and an EOS first
        return torch.cat([marginal[top], marginal[rest].sum()[None] + first[eos]])

    first, eos = next_probs(prompt), 63  # a first token of EOS ends the output: counted with the rest
    marginal = sum(first[t] * next_probs(prompt + [t]) for t in range(first.numel()) if t != eos)  # [V]
    draws, counts, ended = 1500, torch.zeros(first.numel()), 0
    for seed in range(draws):
        # 3 tokens: where the lookup's first draft is rejected, the text leaves the repeated
        # answer and the second token comes from a step the head drafts
        generation = pipe.run(prompt, max_new_tokens=3, seed=seed)
        if len(generation.token_ids) < 2:
            ended += 1
        else:
            counts[generation.token_ids[1]] += 1
    assert lookup.found > draws / 10 and lookup.missed > draws / 10  # the lookup's drafts and the head's
    top = marginal.argsort(descending=True)[:7]
    rest = torch.ones_like(marginal, dtype=torch.bool)
    rest[top] = False
    cells = torch.cat([counts[top], counts[rest].sum()[None] + ended])
    expected = cells_of(first, marginal)
    assert float(((cells - expected * draws) ** 2 / (expected * draws)).sum()) < CHI2_CRITICAL_1E6_DF7
    # the test has power: the marginal a realistic bug gives (the temperature left out) fails it
    hot = next_probs(prompt, 1.0)
    wrong = cells_of(hot, sum(hot[t] * next_probs(prompt + [t], 1.0) for t in range(hot.numel()) if t != eos))
    assert float(((cells - wrong * draws) ** 2 / (wrong * draws)).sum()) > 10 * CHI2_CRITICAL_1E6_DF7


def test_lookup_from_config_and_a_bad_lookup_is_one_clear_error(tmp_path, target_dir):  # noqa: F811
    save_eagle(random_head(9).float(), tmp_path / "heads", target=str(target_dir))
    base = [f"model={target_dir}", "proposer=eagle", f"proposer.heads={tmp_path / 'heads'}", "gamma=3", *PINNED]
    pipeline = Pipeline.from_config(compose([*base, "proposer.lookup=true", "proposer.lookup_min=1"]))
    assert (pipeline.proposer.lookup.ngram_min, pipeline.proposer.lookup.ngram_max) == (1, 4)
    spec = pipeline.run(PROMPT, max_new_tokens=24)
    assert spec.token_ids == pipeline.run(PROMPT, max_new_tokens=24, speculative=False).token_ids
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0, (spec.stats.drafted, spec.stats.accepted)
    suffix = Pipeline.from_config(compose([*base, "proposer.lookup=suffix", "proposer.lookup_score=1.5"]))
    assert isinstance(suffix.proposer.lookup, SuffixProposer) and suffix.proposer.lookup.min_score == 1.5
    again = suffix.run(PROMPT, max_new_tokens=24)
    assert again.token_ids == spec.token_ids and again.stats.drafted > 0
    for bad, words in (("proposer.lookup_min=abc", "is not an integer"),
                       ("proposer.lookup_max=2", "1 <= lookup_min <= lookup_max"),
                       ("proposer.lookup=prefix", "is not a lookup: use ngram"),
                       ("proposer.lookup_score=-1", "lookup_score=-1 must be a number of tokens")):
        with pytest.raises(SpecpipeError, match=words):
            Pipeline.from_config(compose([*base, *([] if "lookup=" in bad else ["proposer.lookup=true"]), bad]))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_decoding_head_stacks_its_projections_and_follows_its_weights(kind):
    """In decoding (no autograd) a head's q, k, v projections are one matmul, its gate and up
    another, over weights stacked once, and its output projections add the residual inside
    their GEMM (five kernels fewer a head call on a GPU): the outputs are the Linears' one by
    one (float64). A weight changed in place, as a training step changes it, is followed."""
    from test_eagle3 import random_head

    torch.manual_seed(3)
    head = random_head(2) if kind == "eagle3" else EagleHead(SHAPE).double().eval()
    if kind == "eagle":
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0.0, 0.3)
    embeds, features = torch.randn(1, 6, 32, dtype=torch.float64), torch.randn(1, 6, 32, dtype=torch.float64)
    positions = torch.arange(6)[None]
    layer = head.layers[0]

    def both():
        with torch.enable_grad():  # the training path: each Linear alone, the adds apart
            want = head(embeds, features, positions).detach()
        with torch.inference_mode():
            got = head(embeds, features, positions)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        return got

    before = both()
    assert set(layer.self_attn.__dict__["_stacked"]) == {("q_proj", "k_proj", "v_proj")}
    assert set(layer.mlp.__dict__["_stacked"]) == {("gate_proj", "up_proj")}
    with torch.no_grad():  # an optimizer's step: in place
        layer.self_attn.k_proj.weight.mul_(1.5)
        layer.mlp.up_proj.weight.add_(0.05)
    assert not torch.allclose(both(), before)
    with torch.inference_mode():  # a head moved under inference mode: its weights track no version
        head.to(torch.float32).to(torch.float64)
        both()
