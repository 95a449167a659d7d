"""EAGLE-3: greedy output equals plain greedy decoding with random heads (chain and dynamic tree,
full and draft vocabularies, both engines); the layers reach the head through the target
output; the training-time test's mask and a decreasing loss; the speculators layout saved and
loaded bit-exact; heads that do not fit are refused before generation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import PROMPT, VOCAB, tiny_model, tiny_tokenizer, feed
from specpipe.config import compose
from specpipe.controllers.fixed import FixedGamma
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import EagleShape
from specpipe.heads.eagle3 import Eagle3Head, Eagle3Shape, engine_keys
from specpipe.heads.speculators import load_eagle3, save_eagle3
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline
from specpipe.proposers.eagle import TreeShape
from specpipe.proposers.eagle3 import proposer_for
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.typical import TypicalVerifier

GREEDY = SamplingParams()
LAYERS = (1, 2, 3)  # vLLM's aux ids over the 4-layer tiny target: the input of layers 1, 2, 3
LAYER = EagleShape(hidden_size=32, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   intermediate_size=48)


def target4(dtype=torch.float64) -> LoadedModel:
    model = tiny_model(0, layers=4, dtype=dtype)
    model.generation_config.eos_token_id = 1
    return LoadedModel("tiny", model, tiny_tokenizer(1))


def random_head(seed: int, draft_ids: torch.Tensor | None = None, scale: float = 0.3) -> Eagle3Head:
    ids = torch.arange(VOCAB) if draft_ids is None else draft_ids
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Shape(LAYER, 32, len(ids), LAYERS))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, scale)
    head.set_vocabulary(ids)
    return head.double().eval()


def run_both(target, proposer, verifier, gamma: int, tokens: int = 40, engine: str = "auto"):
    plain = Pipeline(target, None, GreedyVerifier(), None, engine=engine).run(PROMPT, max_new_tokens=tokens,
                                                                             speculative=False)
    spec = Pipeline(target, proposer, verifier, FixedGamma(gamma), engine=engine)
    return plain, [spec.run(PROMPT, max_new_tokens=tokens) for _ in range(2)]  # no state leaks between runs


@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: TypicalVerifier(GREEDY)])
@pytest.mark.parametrize("tree", [None, TreeShape(1, 1), TreeShape(3, 10)])
@pytest.mark.parametrize("vocab", ["full", "even ids"])
def test_greedy_equals_plain(verifier, tree, vocab):
    target = target4()
    ids = None if vocab == "full" else torch.arange(0, VOCAB, 2)
    proposer = proposer_for(random_head(1, ids), GREEDY, tree)
    plain, outs = run_both(target, proposer, verifier(), 4)
    for out in outs:
        assert out.token_ids == plain.token_ids and out.stats.drafted > 0
    if ids is not None:  # tokens outside the draft vocabulary are never drafted
        logits = proposer.lm(torch.randn(5, 32, dtype=torch.float64))
        assert torch.isinf(logits[:, 1::2]).all() and torch.isfinite(logits[:, ::2]).all()


@pytest.mark.parametrize("engine", ["native", "hf"])
@pytest.mark.parametrize("tree", [None, TreeShape(3, 10)])
def test_both_engines_in_float32_greedy_equals_plain(engine, tree):
    target = target4(torch.float32)
    plain, outs = run_both(target, proposer_for(random_head(2).float(), GREEDY, tree), GreedyVerifier(), 3,
                           engine=engine)
    assert outs[0].token_ids == plain.token_ids and outs[0].stats.drafted > 0


def test_the_head_reads_the_three_layers_from_the_target_output():
    """The fused input of the prefill is fc(cat(hidden entering layers 1, 2, 3)): the runner's
    keys 0, 1, 2, handed over by the step, not read by hooks."""
    target = target4()
    head = random_head(3)
    proposer = proposer_for(head, GREEDY)
    assert proposer.hidden_layers == engine_keys(LAYERS) == (0, 1, 2)
    runner = make_runner(target.model)
    out = feed(runner, PROMPT, hidden=proposer.hidden_layers)
    hf = target.model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states  # [0]: embeddings
    torch.testing.assert_close(proposer._features(out, 0), head.fc(torch.cat([hf[k][0] for k in LAYERS], -1)))


def test_ttt_mask_is_causal_over_step_zero_and_diagonal_after():
    from specpipe.train.eagle3 import ttt_mask

    mask = ttt_mask(4, 2)[0].int().tolist()
    assert mask == [[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
                    [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0], [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1]]


def test_the_unrolled_step_is_what_drafting_computes():
    """Step 1 of the training-time test at row i equals the proposer's second draft row after
    the true rows 0..i: same inputs, positions and attention, so training trains drafting."""
    from specpipe.heads.eagle import HeadCache
    from specpipe.train.eagle3 import ttt_mask

    head, m = random_head(4), 6
    torch.manual_seed(0)
    fused, embeds = torch.randn(1, m, 32, dtype=torch.float64), torch.randn(1, m + 1, 32, dtype=torch.float64)
    cache = HeadCache()
    step0 = head(embeds[:, :m], fused, torch.arange(m)[None], ttt_mask(m, 0), cache)
    step1 = head(embeds[:, 1:], step0, torch.arange(1, m + 1)[None], ttt_mask(m, 1), cache)
    for i in (0, 3, m - 1):
        drafting = HeadCache()
        first = head(embeds[:, : i + 1], fused[:, : i + 1], torch.arange(i + 1)[None], cache=drafting)
        second = head(embeds[:, i + 1 : i + 2], first[:, -1:], torch.tensor([[i + 1]]), cache=drafting)
        torch.testing.assert_close(step1[0, i], second[0, 0], rtol=1e-10, atol=1e-10)


def test_training_time_test_loss_decreases_and_accuracy_is_measured():
    """A few steps of EAGLE-3 training on a tiny target's cached features lower the loss; the
    held-out figure comes from the proposer's drafting (one number per position, in [0, 1])."""
    from specpipe.train.eagle3 import Eagle3Trainer, Rows

    target = target4(torch.float32)
    runner = make_runner(target.model)
    keys = engine_keys(LAYERS)
    torch.manual_seed(0)
    seqs = []
    for _ in range(6):
        ids = torch.randint(2, VOCAB, (40,)).tolist()
        runner.reset()
        out = feed(runner, ids, hidden=keys)
        seqs.append({"features": torch.cat([out.hidden[k][0] for k in keys], -1).half(),
                     "argmax": out.logits[0].argmax(-1), "tokens": torch.tensor(ids), "start": 0})
    rows = Rows(seqs)
    head = random_head(5, scale=0.05).float().train()
    trainer = Eagle3Trainer(head, target.model.get_input_embeddings().weight.detach(),
                            target.model.lm_head.weight.detach(), lr=3e-3, ttt=3)
    batch = list(range(len(rows.seqs)))
    first = float(trainer.loss(rows.tensors(batch)).detach())
    for _ in range(30):
        trainer.step(rows, batch)
    assert float(trainer.loss(rows.tensors(batch)).detach()) < 0.7 * first
    accuracy = trainer.accuracy(rows, depth=3)
    assert len(accuracy) == 3 and all(0 <= a <= 1 for a in accuracy) and accuracy[0] > 0
    assert accuracy[0] >= accuracy[1] >= accuracy[2]  # all k first tokens right: never more likely deeper


def test_save_then_load_is_bit_exact_in_the_speculators_layout(tmp_path):
    head = random_head(6, torch.tensor([2, 3, 5, 7, 11, 13, 40])).float()
    save_eagle3(head, tmp_path / "e3", target="tiny", extra={"held_out_top1": [0.5]}, gamma=5)
    loaded = load_eagle3(tmp_path / "e3")
    assert loaded.shape == head.shape
    assert set(head.state_dict()) == set(loaded.state_dict())
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]) and tensor.dtype == loaded.state_dict()[name].dtype, name
    assert loaded.draft_ids.tolist() == [2, 3, 5, 7, 11, 13, 40]
    names = load_file(str(tmp_path / "e3" / "model.safetensors"))
    assert names["fc.weight"].shape == (32, 96) and names["layers.0.self_attn.q_proj.weight"].shape == (32, 64)
    assert names["lm_head.weight"].shape == (7, 32) and names["d2t"].dtype == torch.int64
    assert names["t2d"].dtype == torch.bool and int(names["t2d"].sum()) == 7 and "embed_tokens.weight" not in names
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 7
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert "specpipe" not in config  # speculators validates config.json: specpipe's facts live beside it
    assert json.loads((tmp_path / "e3" / "specpipe.json").read_text())["held_out_top1"] == [0.5]


def test_a_head_past_the_shard_bound_is_saved_in_shards_and_loads_bit_exact(tmp_path, monkeypatch):
    import specpipe.heads.io as io

    monkeypatch.setattr(io, "SHARD_BYTES", 4000)
    head = random_head(6, torch.tensor([2, 3, 5, 7, 11, 13, 40])).float()
    save_eagle3(head, tmp_path / "e3", target="tiny")
    files = {p.name for p in (tmp_path / "e3").iterdir()}
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-")]) > 1
    loaded = load_eagle3(tmp_path / "e3")
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in head.state_dict().items())
    (tmp_path / "e3" / sorted(f for f in files if f.startswith("model-"))[0]).unlink()
    with pytest.raises(SpecpipeError, match="lacks model-00001"):
        load_eagle3(tmp_path / "e3")


def test_a_specforge_layout_head_loads(tmp_path):
    """The EAGLE authors' / SpecForge layout: a Llama config at the top, `midlayer.` weights."""
    head = random_head(7).float()
    save_eagle3(head, tmp_path / "e3", target="tiny")
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    flat = {**config["transformer_layer_config"], "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": VOCAB, "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(LAYERS)}}
    from safetensors.torch import save_file

    state = {k.replace("layers.0.", "midlayer."): v for k, v in load_file(str(tmp_path / "e3" / "model.safetensors")).items()
             if k not in ("d2t", "t2d")}
    (tmp_path / "sf").mkdir()
    save_file(state, str(tmp_path / "sf" / "model.safetensors"))
    (tmp_path / "sf" / "config.json").write_text(json.dumps(flat))
    loaded = load_eagle3(tmp_path / "sf")
    assert torch.equal(loaded.layers[0].self_attn.q_proj.weight, head.layers[0].self_attn.q_proj.weight)
    assert loaded.draft_ids.tolist() == list(range(VOCAB))


@pytest.fixture
def target4_dir(tmp_path):
    model = tiny_model(0, layers=4, dtype=torch.float32)
    model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    return tmp_path / "target"


def test_heads_that_do_not_fit_are_refused_before_generation(tmp_path, target4_dir):
    def saved(name: str, layer=LAYER, layers=LAYERS, target=str(target4_dir), draft=VOCAB):
        save_eagle3(Eagle3Head(Eagle3Shape(layer, layer.hidden_size, draft, layers)), tmp_path / name, target=target)

    saved("narrow", EagleShape(**{**LAYER.__dict__, "hidden_size": 16, "head_dim": 4}))
    saved("wide-vocab", EagleShape(**{**LAYER.__dict__, "vocab_size": VOCAB + 1}), draft=VOCAB + 1)
    saved("deep", layers=(2, 3, 9))
    saved("other-target", target="smollm2-135m")
    saved("two-layers")
    two = json.loads((tmp_path / "two-layers" / "config.json").read_text())
    two["transformer_layer_config"]["num_hidden_layers"] = 2
    (tmp_path / "two-layers" / "config.json").write_text(json.dumps(two))
    from specpipe.heads.io import save_eagle
    from test_eagle import SHAPE
    from specpipe.heads.eagle import EagleHead

    save_eagle(EagleHead(SHAPE), tmp_path / "eagle1", target=str(target4_dir))
    for folder, words in (("narrow", "hidden size 16"), ("wide-vocab", f"vocabulary {VOCAB + 1}"),
                          ("deep", r"entering layers \[2, 3, 9\]"), ("other-target", "trained on smollm2-135m"),
                          ("two-layers", "2 draft decoder layers"), ("eagle1", "not an EAGLE-3 head"),
                          ("missing", "config.json")):
        cfg = compose([f"model={target4_dir}", "proposer=eagle3", f"proposer.heads={tmp_path / folder}"])
        with pytest.raises(SpecpipeError, match=words):
            Pipeline.from_config(cfg)


def test_a_head_with_its_own_embeddings_drafts_with_them():
    """speculators checkpoints carry `embed_tokens`: drafting reads those, not the target's
    (the same unless the head trained them), and the output is still plain greedy's."""
    from specpipe.heads.eagle import HeadCache

    target = target4()
    head = random_head(8)
    own = target.model.get_input_embeddings().weight.detach() * 3.0
    head.embed_tokens = torch.nn.Embedding.from_pretrained(own, freeze=True)
    proposer = proposer_for(head, GREEDY)
    plain, outs = run_both(target, proposer, GreedyVerifier(), 3)
    assert outs[0].token_ids == plain.token_ids
    features = torch.randn(2, 32, dtype=torch.float64)
    got = proposer._feed(features[None], torch.tensor([[4, 9]]), torch.arange(2)[None], HeadCache())[0]
    want = head(own[[4, 9]].float()[None], features[None], torch.arange(2)[None], cache=HeadCache())[0]  # read as float32
    torch.testing.assert_close(got, want)
