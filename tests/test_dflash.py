"""DFlash: the drafter computes what z-lab's reference `DFlashDraftModel` computes (same logits
and tokens from the same inputs, first draft and after a verdict); greedy output equals plain
greedy decoding, alone and in a batch, with a random drafter and with one that copies the
target's next token (so drafts are accepted); both checkpoint formats load and what does not
fit the target is refused before anything loads.

The copying drafter needs a target whose next token is a function of the current token alone
(`bigram_target`: its layers add nothing to the residual stream). Its drafter attends evenly to
every key, and every key but the block's first (the last committed token) has a zero value, so
every block row's output is that token's embedding, scaled: through the target's final norm
weights and LM head, exactly the target's own next token. The first guess of every draft is
accepted; the later ones repeat it and are mostly rejected, so both branches run.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import PINNED, PROMPT, VOCAB, feed, one_row, tiny_model, tiny_tokenizer
from specpipe.config import compose
from specpipe.controllers.fixed import FixedGamma
from specpipe.decode.loop import Request
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.heads.dflash import DFlashDrafter, DFlashShape, build_target_layer_ids
from specpipe.heads.dflash_format import fit_summary, load_dflash, read_shape, save_dflash
from specpipe.heads.eagle import EagleShape
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline
from specpipe.proposers.dflash import DFlashProposer
from specpipe.proposers.lookup import make_lookup
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.types import Rows
from specpipe.types import RowVerdict
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier

GREEDY = SamplingParams()
MASK = VOCAB - 1
IDS = (0, 2)  # the runner's keys: the residual stream after target layers 0 and 2 (of 4)
LAYER = EagleShape(hidden_size=32, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   intermediate_size=48, rope_theta=1_000_000.0)
PROMPTS = [PROMPT, [3, 60, 22], [44], [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [5, 5, 5, 5], [9, 9, 30, 2, 61]]
LENGTHS = [40, 7, 1, 25, 13, 33]


def target4(dtype=torch.float64, bigram: bool = False) -> LoadedModel:
    model = tiny_model(0, layers=4, dtype=dtype)
    if bigram:  # every layer adds nothing: the next token depends on the current one alone
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.model.embed_tokens.weight[MASK] = 0.0  # the copying drafter's masks carry nothing
    model.generation_config.eos_token_id = 1
    return LoadedModel("tiny", model, tiny_tokenizer(1))


def shape(layers: int = 2, block: int = 6, ids=IDS, layer=LAYER) -> DFlashShape:
    return DFlashShape(layer, layers, tuple(ids), block, MASK)


def random_drafter(seed: int, layers: int = 2, block: int = 6, scale: float = 0.3, **kw) -> DFlashDrafter:
    torch.manual_seed(seed)
    drafter = DFlashDrafter(shape(layers, block, **kw))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, scale)
    return drafter.double().eval()


def copying_drafter(block: int = 6) -> DFlashDrafter:
    """See the module docstring: q = 0 (even attention), fc = 0 (context values 0), v and o the
    identity, MLPs adding nothing, norms of weight 1 (the target's), a tiny epsilon (scale-free)."""
    layer = EagleShape(**{**LAYER.__dict__, "num_key_value_heads": 4, "rms_norm_eps": 1e-30})
    drafter = random_drafter(5, block=block, layer=layer).eval()
    with torch.no_grad():
        drafter.fc.weight.zero_()
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        for layer in drafter.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.v_proj.weight.copy_(torch.eye(32))
            layer.self_attn.o_proj.weight.copy_(torch.eye(32))
            layer.mlp.down_proj.weight.zero_()
    return drafter


def decode(pipe: Pipeline, concurrency: int) -> list[list[int]]:
    requests = [Request(p, n, seed=i) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
    tokens: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    for event in pipe.serve(requests, concurrency=concurrency):
        tokens[event.index].extend(event.tokens)
    return [tokens[i] for i in range(len(requests))]


def plain(target, prompt, tokens: int) -> list[int]:
    return Pipeline(target, None, GreedyVerifier(), None).run(prompt, max_new_tokens=tokens, speculative=False).token_ids


# --- lossless ------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: RejectionVerifier(GREEDY)])
@pytest.mark.parametrize("gamma", [1, 3, 8])  # 8: past the block of 6, drafts 5
def test_a_random_drafter_keeps_greedy_output(verifier, gamma):
    target = target4()
    pipe = Pipeline(target, DFlashProposer(random_drafter(1), GREEDY), verifier(), FixedGamma(gamma))
    for prompt in (PROMPT, [44], [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]):
        expected = plain(target, prompt, 40)
        for _ in range(2):  # no state leaks between runs
            out = pipe.run(prompt, max_new_tokens=40)
            assert out.token_ids == expected and out.stats.drafted > 0
            assert max(out.stats.gamma_trace) == min(gamma, 5)  # γ = 8 drafts the block's 5 masks


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_the_copying_drafter_is_accepted_and_keeps_greedy_output(engine):
    target = target4(bigram=True)
    expected = Pipeline(target, None, GreedyVerifier(), None, engine=engine).run(
        PROMPT, max_new_tokens=40, speculative=False).token_ids
    pipe = Pipeline(target, DFlashProposer(copying_drafter(), GREEDY), GreedyVerifier(), FixedGamma(4), engine=engine)
    out = pipe.run(PROMPT, max_new_tokens=40)
    assert out.token_ids == expected
    stats = out.stats
    assert stats.drafted > 0 and stats.accepted >= stats.steps - 1  # every first guess but the last step's
    assert stats.per_position_acceptance[0] == 1.0 and stats.accepted < stats.drafted  # later guesses: mostly not


@pytest.mark.parametrize("drafter", ["random", "copying"])
def test_every_batched_row_equals_its_request_alone(drafter):
    target = target4(bigram=drafter == "copying")
    made = random_drafter(2) if drafter == "random" else copying_drafter()
    pipe = Pipeline(target, DFlashProposer(made, GREEDY), GreedyVerifier(), FixedGamma(4))
    alone = [plain(target, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    assert len({len(a) for a in alone}) > 2  # rows finish at different steps
    for concurrency in (2, 4):
        assert decode(pipe, concurrency) == alone, concurrency


def test_a_row_drafts_in_a_batch_what_it_drafts_alone():
    """The block's mask hides other rows' context lengths and block widths: the same drafts."""
    target = target4()
    runner = make_runner(target.model)
    runner.reserve(2)
    prompts, gammas = [PROMPT, [3, 60, 22, 5]], [4, 2]
    batched = DFlashProposer(random_drafter(3), GREEDY)
    batched.bind(runner)
    batched.reserve(2)
    for row, prompt in enumerate(prompts):
        runner.reset(row)
        batched.prefill(row, prompt, runner.prefill(row, prompt[:-1], hidden=IDS))
    both = batched.propose(Rows(prompts, [RowRandom(0)] * 2, lambda i: 0.0, torch.device("cpu")), gammas)
    assert both.counts == (4, 2)
    for row, (prompt, gamma) in enumerate(zip(prompts, gammas)):
        alone = DFlashProposer(random_drafter(3), GREEDY)
        alone.bind(runner)
        runner.reset(1)
        alone.prefill(0, prompt, runner.prefill(1, prompt[:-1], hidden=IDS))
        got = alone.propose(one_row(prompt), [gamma])
        assert got.tokens[0, :gamma].tolist() == both.tokens[row, :gamma].tolist()
        torch.testing.assert_close(got.confidence[0, :gamma], both.confidence[row, :gamma], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("lookup", ["ngram", "suffix"])
def test_a_lookup_drafts_first_and_the_drafter_where_it_finds_nothing(lookup):
    target = target4()
    pipe = Pipeline(target, DFlashProposer(random_drafter(1), GREEDY, make_lookup(lookup, 1, 3, 1.0)),
                    GreedyVerifier(), FixedGamma(4))
    repeating = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
    out = pipe.run(repeating, max_new_tokens=30)
    assert out.token_ids == plain(target, repeating, 30) and out.stats.accepted > 0
    alone = [plain(target, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    assert decode(pipe, 3) == alone


def test_sampled_drafts_carry_their_distributions_and_reproduce():
    target = target4()
    sampling = SamplingParams(temperature=0.8)
    pipe = Pipeline(target, DFlashProposer(random_drafter(1), sampling), RejectionVerifier(sampling), FixedGamma(3),
                    sampling=sampling)
    runs = [pipe.run(PROMPT, max_new_tokens=30, seed=4).token_ids for _ in range(2)]
    assert runs[0] == runs[1] and runs[0]  # the row's own seeded streams: the same draws
    proposer = DFlashProposer(random_drafter(1), sampling)
    runner = make_runner(target.model)
    proposer.bind(runner)
    proposer.prefill(0, PROMPT, runner.prefill(0, PROMPT[:-1], hidden=IDS))
    draft = proposer.propose(one_row(PROMPT), [3])
    assert draft.probs.shape == (1, 3, VOCAB)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(1, 3))
    assert all(draft.probs[0, i, draft.tokens[0, i]] > 0 for i in range(3))


def test_the_drafter_reads_its_layers_from_the_target_output():
    """The context is fc(cat(the residual stream after target layers 0 and 2)): HF's hidden
    states 1 and 3, handed over by the step, as z-lab's `extract_context_feature` reads them."""
    target = target4()
    proposer = DFlashProposer(random_drafter(4), GREEDY)
    assert proposer.hidden_layers == IDS
    out = feed(make_runner(target.model), PROMPT, hidden=IDS)
    hf = target.model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states  # [0]: embeddings
    torch.testing.assert_close(proposer._features(out), torch.cat([hf[k + 1] for k in IDS], -1))


# --- the reference implementation ----------------------------------------------------------


def _reference_logits(model, target, context: torch.Tensor, block: list[int], start: int, cache):
    """z-lab's draft step (dflash_generate's body): logits [W - 1, V] of a block at `start`
    after context features [1, m, k·H] at start - m .. start - 1."""
    from dflash.model import _crop_to, _raw_input_embeddings

    width = len(block)
    positions = torch.arange(start - context.shape[1], start + width)[None]
    noise = _raw_input_embeddings(target, torch.tensor([block]))
    hidden = model(target_hidden=context, noise_embedding=noise, position_ids=positions, past_key_values=cache,
                   use_cache=True)[:, 1 - width:]
    _crop_to(cache, start)  # the block's keys go; the context's stay
    return model.compute_logits(hidden, target.lm_head)[0]


def test_the_drafter_matches_the_reference_dflash_package(tmp_path):
    """A tiny random checkpoint in z-lab's format, read by `dflash.DFlashDraftModel` and by
    specpipe: the same draft logits and tokens at the first draft, and after a verdict that
    kept two drafts (the context grows by the verified rows; the cache keeps the earlier)."""
    reference = pytest.importorskip("dflash.model", reason="the reference `dflash` package is not installed")
    from transformers import DynamicCache

    target = target4(torch.float32)
    drafter = random_drafter(6).float()
    save_dflash(drafter, tmp_path / "d", num_target_layers=4)
    model = reference.DFlashDraftModel.from_pretrained(tmp_path / "d", dtype=torch.float32).eval()
    assert list(model.target_layer_ids) == list(IDS) and model.mask_token_id == MASK and model.block_size == 6
    runner = make_runner(target.model, engine="hf")
    sampled = SamplingParams(temperature=1.0)  # the draft's distributions are the softmax of its logits
    ours = {"greedy": DFlashProposer(load_dflash(tmp_path / "d"), GREEDY),
            "sampled": DFlashProposer(load_dflash(tmp_path / "d"), sampled)}
    for proposer in ours.values():
        proposer.bind(runner)
    prefill = runner.prefill(0, PROMPT[:-1], hidden=IDS)
    for proposer in ours.values():
        proposer.prefill(0, PROMPT, prefill)
    with torch.no_grad():
        hf = target.model(torch.tensor([PROMPT[:-1]]), output_hidden_states=True).hidden_states
    context, cache, tokens, start = reference.extract_context_feature(hf, list(IDS)), DynamicCache(), list(PROMPT), len(PROMPT) - 1
    for step in range(2):
        with torch.no_grad():
            want = _reference_logits(model, target.model, context, [tokens[-1]] + [MASK] * 5, start, cache)
        greedy = ours["greedy"].propose(one_row(tokens), [5])
        probs = ours["sampled"].propose(one_row(tokens), [5]).probs[0]
        torch.testing.assert_close(probs, torch.softmax(want, -1), rtol=1e-4, atol=1e-5)
        assert greedy.tokens[0].tolist() == want.argmax(-1).tolist()
        # the target verifies [last, two of the drafts, ...]: it keeps two, then its own token
        block = [tokens[-1], *greedy.tokens[0, :2].tolist()]
        out = runner.forward(torch.tensor([block]), hidden=IDS)
        runner.commit([3])
        verdict = [RowVerdict(2, int(out.logits[0, 2].argmax()), 2, tuple(block[1:]))]
        for proposer in ours.values():
            proposer.commit(None, verdict, out)
        with torch.no_grad():
            hf = target.model(torch.tensor([tokens[:-1] + block]), output_hidden_states=True).hidden_states
        context = reference.extract_context_feature(hf, list(IDS))[:, -3:]
        tokens += [*block[1:], verdict[0].next_token]
        start += 3


# --- checkpoints and checks -----------------------------------------------------------------


def test_zlab_format_saves_and_loads_bit_exact(tmp_path):
    drafter = random_drafter(7).float()
    save_dflash(drafter, tmp_path / "d", num_target_layers=4)
    loaded = load_dflash(tmp_path / "d")
    assert loaded.shape == drafter.shape and loaded.lm_head is None
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    names = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert names["fc.weight"].shape == (32, 64) and names["layers.1.self_attn.k_norm.weight"].shape == (8,)
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names  # the target's
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 6
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": list(IDS)}


def test_a_zlab_config_without_layer_ids_reads_the_default_spread(tmp_path):
    save_dflash(random_drafter(7, layers=3, ids=(1, 9, 17)).float(), tmp_path / "d", num_target_layers=36)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]
    config["mask_token_id"] = config["dflash_config"].pop("mask_token_id")  # top level, as older configs put it
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    assert read_shape(tmp_path / "d").target_layer_ids == build_target_layer_ids(36, 3) == (1, 17, 33)
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33) and build_target_layer_ids(28, 1) == (14,)


def test_a_speculators_checkpoint_loads_with_its_draft_vocabulary(tmp_path):
    """speculators' dflash: vLLM's aux ids (the input of layer k: the runner's key k - 1) and an
    LM head of its own over a draft vocabulary, mapped to target ids by d2t."""
    drafter = random_drafter(8).float()
    state = {k: v for k, v in drafter.state_dict().items()}
    draft_ids = torch.tensor([2, 3, 5, 7, 11, 40])
    state["lm_head.weight"] = torch.randn(6, 32)
    state["d2t"] = draft_ids - torch.arange(6)
    state["embed_tokens.weight"] = torch.zeros(VOCAB, 32)  # the verifier's: dropped
    (tmp_path / "s").mkdir()
    save_file(state, str(tmp_path / "s" / "model.safetensors"))
    layer = json.loads(json.dumps(LAYER.__dict__))
    config = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"], "draft_vocab_size": 6,
              "block_size": 6, "mask_token_id": MASK, "aux_hidden_state_layer_ids": [k + 1 for k in IDS],
              "transformer_layer_config": {**layer, "model_type": "qwen3", "num_hidden_layers": 2,
                                           "layer_types": ["full_attention"] * 2}}
    (tmp_path / "s" / "config.json").write_text(json.dumps(config))
    loaded = load_dflash(tmp_path / "s")
    assert loaded.shape.target_layer_ids == IDS and loaded.draft_ids.tolist() == draft_ids.tolist()
    assert torch.equal(loaded.layers[0].self_attn.q_proj.weight, drafter.layers[0].self_attn.q_proj.weight)
    assert fit_summary(tmp_path / "s")["reads_layers"] == [1, 3]
    target = target4(torch.float32)
    pipe = Pipeline(target, DFlashProposer(loaded, GREEDY), GreedyVerifier(), FixedGamma(3))
    out = pipe.run(PROMPT, max_new_tokens=20)
    assert out.token_ids == plain(target, PROMPT, 20) and out.stats.drafted > 0
    logits = pipe.proposer.lm(torch.randn(4, 32))  # tokens outside the draft vocabulary are never drafted
    assert torch.isinf(logits[:, 0]).all() and torch.isfinite(logits[:, draft_ids]).all()


@pytest.mark.parametrize("change, words", [
    ({"architectures": ["DFlash2DraftModel"]}, "not a DFlash drafter"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
    ({"is_causal": True}, "causal draft layers"),
    ({"attention_bias": True}, "attention biases"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling yarn"),
    ({"dflash_config": {"target_layer_ids": [0, 2]}}, "mask_token_id None"),
])
def test_what_the_drafter_does_not_compute_is_refused_by_name(tmp_path, change, words):
    save_dflash(random_drafter(7).float(), tmp_path / "d", num_target_layers=4)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    (tmp_path / "d" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(SpecpipeError, match=words):
        load_dflash(tmp_path / "d")


@pytest.fixture
def target4_dir(tmp_path):
    model = target4(torch.float32).model
    model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    return tmp_path / "target"


@pytest.mark.parametrize("quantize", ["none", "auto"])  # auto: fp16 kernels on the CPU
def test_proposer_dflash_from_the_config_keeps_greedy_output(tmp_path, target4_dir, quantize):
    save_dflash(random_drafter(9).float(), tmp_path / "d", num_target_layers=4)
    cfg = compose([f"model={target4_dir}", "proposer=dflash", f"proposer.heads={tmp_path / 'd'}", "gamma=4",
                   "proposer.lookup=suffix", f"proposer.quantize={quantize}", *PINNED])
    pipe = Pipeline.from_config(cfg)
    assert isinstance(pipe.proposer, DFlashProposer) and pipe.hidden == IDS
    out = pipe.run(PROMPT, max_new_tokens=20)
    expected = Pipeline(pipe.target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=20, speculative=False)
    assert out.token_ids == expected.token_ids and out.stats.drafted > 0


def test_drafters_that_do_not_fit_the_target_are_refused_before_loading(tmp_path, target4_dir):
    def saved(name: str, **kw):
        save_dflash(DFlashDrafter(shape(**kw)), tmp_path / name, num_target_layers=4)

    saved("narrow", layer=EagleShape(**{**LAYER.__dict__, "hidden_size": 16, "head_dim": 4}))
    saved("wide-vocab", layer=EagleShape(**{**LAYER.__dict__, "vocab_size": VOCAB + 1}))
    saved("deep", ids=(1, 9))
    (tmp_path / "empty").mkdir()
    for folder, words in (("narrow", "hidden size 16"), ("wide-vocab", f"vocabulary {VOCAB + 1}"),
                          ("deep", r"entering layers \[2, 10\]"), ("empty", "config.json")):
        cfg = compose([f"model={target4_dir}", "proposer=dflash", f"proposer.heads={tmp_path / folder}"])
        with pytest.raises(SpecpipeError, match=words):
            Pipeline.from_config(cfg)
