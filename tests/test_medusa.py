"""Medusa: greedy output equals plain greedy decoding with random heads; save/load; refusals."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, VOCAB, tiny_model, tiny_target, tiny_tokenizer
from specpipe.config import compose
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.errors import SpecpipeError
from specpipe.heads.io import load_medusa, save_medusa
from specpipe.heads.medusa import MedusaHeads
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline
from specpipe.proposers.medusa import MedusaProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier

GREEDY = SamplingParams()


def random_heads(seed: int, hidden: int = 32, num_heads: int = 4, shared: bool = True, scale: float = 0.5) -> MedusaHeads:
    """Heads with random (not zero) blocks: their guesses are varied and mostly wrong."""
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, VOCAB, num_heads, num_layers=1, shared_lm_head=shared)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.double()


@pytest.mark.parametrize("engine", ["native", "hf"])
@pytest.mark.parametrize("verifier", [GreedyVerifier, lambda: RejectionVerifier(GREEDY), lambda: TypicalVerifier(GREEDY)])
@pytest.mark.parametrize("gamma", [1, 3, 4, 6])
@pytest.mark.parametrize("heads", ["zero", "random", "own-lm-heads"])
def test_greedy_equals_plain(verifier, gamma, heads, engine):
    target = tiny_target()
    made = {"zero": lambda: MedusaHeads(32, VOCAB, 4).double(), "random": lambda: random_heads(1),
            "own-lm-heads": lambda: random_heads(2, shared=False)}[heads]()
    plain = Pipeline(target, None, GreedyVerifier(), None, engine=engine).run(PROMPT, max_new_tokens=40,
                                                                              speculative=False)
    spec = Pipeline(target, MedusaProposer(made, GREEDY), verifier(), FixedGamma(gamma), engine=engine)
    for _ in range(2):  # twice: a proposer's state must not leak from one generation to the next
        out = spec.run(PROMPT, max_new_tokens=40)
        assert out.token_ids == plain.token_ids
    assert out.stats.drafted > 0 and out.stats.steps < 40 + 1
    assert max(out.stats.gamma_trace) == min(gamma, 4)  # never more tokens than heads


def test_zero_heads_repeat_the_next_token_guess():
    """Untrained (zero) blocks make every head say what the target's LM head says."""
    target = tiny_target()
    heads = MedusaHeads(32, VOCAB, 3).double()
    feature = torch.randn(1, 32, dtype=torch.float64)
    logits = heads(feature, make_runner(target.model).lm_head)
    assert torch.equal(logits[0], logits[2])
    torch.testing.assert_close(logits[0], target.model.lm_head(feature).detach(), rtol=0, atol=1e-12)


def test_with_the_cost_controller_greedy_equals_plain():
    target = tiny_target()
    plain = Pipeline(target, None, GreedyVerifier(), None).run(PROMPT, max_new_tokens=40, speculative=False)
    pipe = Pipeline(target, MedusaProposer(random_heads(3), GREEDY), GreedyVerifier(),
                    CostModelGamma(3, gamma_min=0, gamma_max=4))
    assert pipe.run(PROMPT, max_new_tokens=40).token_ids == plain.token_ids


@pytest.mark.parametrize("shared", [True, False])
def test_save_then_load_is_bit_exact(tmp_path, shared):
    heads = random_heads(4, shared=shared).float()
    save_medusa(heads, tmp_path / "heads", target="tiny")
    loaded = load_medusa(tmp_path / "heads")
    assert loaded.shared_lm_head == shared and loaded.num_heads == 4
    want, got = heads.state_dict(), loaded.state_dict()
    assert list(got) == list(want)  # every tensor, under its own name
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    names = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "heads" / "model.safetensors")))
    assert "blocks.0.layers.0.weight" in names and "blocks.3.layers.0.bias" in names  # vLLM's names
    assert ("lm_heads.0.weight" in names) != shared


@pytest.fixture
def target_dir(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(0, dtype=torch.float32)
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    return tmp_path / "target"


def test_heads_that_do_not_fit_are_refused_before_generation(tmp_path, target_dir):
    save_medusa(MedusaHeads(16, VOCAB, 2), tmp_path / "narrow", target=str(target_dir))
    save_medusa(MedusaHeads(32, VOCAB + 1, 2), tmp_path / "wide-vocab", target=str(target_dir))
    save_medusa(MedusaHeads(32, VOCAB, 2), tmp_path / "other-target", target="smollm2-135m")
    for folder, words in (("narrow", "hidden size 16"), ("wide-vocab", f"vocabulary {VOCAB + 1}"),
                          ("other-target", "trained on smollm2-135m"), ("missing", "config.json")):
        cfg = compose([f"model={target_dir}", "proposer=medusa", f"proposer.heads={tmp_path / folder}"])
        with pytest.raises(SpecpipeError, match=words):
            Pipeline.from_config(cfg)


def test_from_config(tmp_path, target_dir):
    save_medusa(random_heads(5).float(), tmp_path / "heads", target=str(target_dir))
    cfg = compose([f"model={target_dir}", "proposer=medusa", f"proposer.heads={tmp_path / 'heads'}", "gamma=3"])
    pipeline = Pipeline.from_config(cfg)
    spec = pipeline.run(PROMPT, max_new_tokens=24)
    assert spec.token_ids == pipeline.run(PROMPT, max_new_tokens=24, speculative=False).token_ids
    assert spec.stats.drafted > 0


def test_medusa_without_heads_is_one_clear_error(target_dir):
    from test_cli import assert_user_error, specpipe

    assert_user_error(specpipe("generate", f"model={target_dir}", "proposer=medusa"), "proposer.heads=DIR",
                      "specpipe train")
