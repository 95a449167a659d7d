"""The native engine against transformers' own forward, and the properties speculation relies
on: rollback by length, row independence in a batch, bitwise-exact precisions, no recompiles.

Tiny random Llama and Qwen2 models (Qwen2 has q/k/v biases); no downloads.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from conftest import BF16_TOLERANCE, PROMPT, TREE_PARENTS, VOCAB, assert_tree_rows_equal_paths, feed, tiny_model
from specpipe.engine import FINAL, make_runner, pick_engine
from specpipe.engine.footprint import cache_bytes, weight_bytes
from specpipe.errors import SpecpipeError

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tiny_qwen(seed: int = 0, dtype=torch.float64) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero biases, so that fusing them is tested
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


MODELS = {"llama": lambda: tiny_model(0), "qwen2": lambda: tiny_qwen(0)}


@pytest.mark.parametrize("family", MODELS)
def test_native_logits_and_features_equal_transformers(family):
    model = MODELS[family]()
    hf, native = make_runner(model, engine="hf"), make_runner(model, engine="native")
    assert (hf.engine, native.engine) == ("hf", "native")
    for ids in (PROMPT, [3, 60], [9]):  # a prefill, then two steps on the cache
        a, b = feed(hf, ids, hidden=(0, FINAL)), feed(native, ids, hidden=(0, FINAL))
        # transformers computes RMSNorm in float32 even for float64 models: agreement to ~1e-6
        torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(b.hidden[FINAL], a.hidden[FINAL], rtol=0, atol=1e-5)
        torch.testing.assert_close(b.hidden[0], a.hidden[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(native.lm_head(torch.ones(2, 32, dtype=torch.float64)),
                               hf.lm_head(torch.ones(2, 32, dtype=torch.float64)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", MODELS)
def test_rollback_is_a_length(family):
    """crop then forward == a fresh forward of the kept prefix plus the new tokens."""
    model = MODELS[family]()
    runner, fresh = make_runner(model, engine="native"), make_runner(model, engine="native")
    feed(runner, PROMPT + [11, 12, 13, 14])
    runner.crop(0, len(PROMPT) + 1)
    got = feed(runner, [40, 41]).logits
    want = feed(fresh, PROMPT + [11, 40, 41]).logits[:, -2:]
    assert runner.length == len(PROMPT) + 3
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_batch_rows_are_independent_and_ragged():
    """Row b of a batch (its own length, its own tokens) equals that sequence decoded alone."""
    from specpipe.engine.native import NativeRunner

    model = tiny_qwen(1)
    prefixes = torch.tensor([[5, 17, 33, 2, 9, 41], [7, 8, 9, 10, 11, 12], [60, 1, 2, 3, 4, 5]])
    batch = NativeRunner(model, rows=3)
    batch.forward(prefixes)
    lengths = torch.tensor([6, 4, 2])
    batch.commit(lengths.tolist())  # ragged: the rows now hold 6, 4 and 2 tokens
    new = torch.tensor([[20, 21, 22], [30, 31, 32], [40, 41, 42]])
    out = batch.forward(new, hidden=(FINAL,))
    assert batch.lengths == [9, 7, 5]
    for row in range(3):
        alone = make_runner(model, engine="native")
        ids = prefixes[row, : lengths[row]].tolist() + new[row].tolist()
        want = feed(alone, ids, hidden=(FINAL,))
        torch.testing.assert_close(out.logits[row], want.logits[0, -3:], rtol=0, atol=1e-10)
        torch.testing.assert_close(out.hidden[FINAL][row], want.hidden[FINAL][0, -3:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("precision", ["bf16", "w8a16"])
@pytest.mark.parametrize("family", MODELS)
def test_exact_precisions_are_bitwise_across_block_sizes(family, precision):
    """Every row of a 2-, 5- and 9-token block is bitwise equal to one-token forwards."""
    model = MODELS[family]().float()
    runner = make_runner(model, engine="native", precision=precision)
    block = [20, 21, 22, 23, 24, 25, 26, 27, 28]
    feed(runner, PROMPT)
    singles = torch.cat([feed(runner, [t]).logits[0] for t in block])  # [9, V]
    for k in (2, 5, 9):
        runner.crop(0, len(PROMPT))
        rows = feed(runner, block[:k]).logits[0]
        assert torch.equal(rows, singles[:k]), k


@pytest.mark.parametrize("parents", [TREE_PARENTS, (-1, 0, 1, 2, 0, 4, 1, 6, 4, 0)], ids=["by depth", "depth first"])
@pytest.mark.parametrize("precision", ["bf16", "w8a16"])
@pytest.mark.parametrize("family", MODELS)
def test_exact_precisions_tree_rows_equal_their_paths(family, precision, parents):
    """Every row of a tree block (each path laid out in the block's slots in turn) is bitwise
    equal to one-token forwards along its path, for trees ordered by depth (EAGLE-2's) or not
    (a suffix tree's)."""
    runner = make_runner(MODELS[family]().float(), engine="native", precision=precision)
    assert_tree_rows_equal_paths(runner, PROMPT, list(range(30, 42)), parents)


@pytest.mark.parametrize("shape", [pytest.param((1536, 8960), marks=BF16_TOLERANCE),  # the probe's shape
                                   pytest.param((4608, 1536), marks=BF16_TOLERANCE), (600, 576)])
def test_bf16_kernel_rows_are_bitwise_at_real_model_shapes(shape):
    """Tiny models' matrices are too small to reach oneDNN's other kernels: at Qwen2.5-1.5B's
    down projection (K = 8960) on an AMX CPU, a 1-row `F.linear` and a 2-row one disagree (and 2-32
    rows and 64 rows). Bf16Linear's fixed-size blocks make every row of any block, decode-sized
    or batched past one block, equal to a one-row call (without AMX, a plain F.linear: bitwise
    where bf16 is `exact`); and its packed weight reads back dense."""
    from specpipe.models.quantize import Bf16Linear

    torch.manual_seed(0)
    weight, bias = torch.randn(shape) / 40, torch.randn(shape[0])
    linear = Bf16Linear(weight, bias)
    x = torch.randn(40, shape[1]).bfloat16()
    singles = torch.cat([linear.matmul(x[i : i + 1]) for i in range(40)])  # [40, out]
    for m in (2, 5, 9, 16, 17, 40):
        assert torch.equal(linear.matmul(x[:m]), singles[:m]), m
    assert torch.equal(linear.dense_weight(), weight.bfloat16())
    want = torch.nn.functional.linear(x.float(), weight.bfloat16().float(), bias.bfloat16().float())
    torch.testing.assert_close(singles.float(), want, rtol=2e-2, atol=5e-2)



def test_bulk_rows_takes_a_block_in_one_call_for_training_passes_and_restores_the_exact_blocks(monkeypatch):
    """`bulk_rows` (the trainer's answers and features) calls the kernel once per block of any
    row count, close to the exact values; outside it, and after an error inside it, a block is
    cut into 16-row calls again."""
    from specpipe.models.linears import Bf16Linear, bulk_rows, has_amx

    if not has_amx():
        pytest.skip("no AMX here: bf16 is one plain F.linear a call either way")
    torch.manual_seed(0)
    linear = Bf16Linear(torch.randn(1536, 8960) / 40, None)
    x = torch.randn(40, 8960).bfloat16()
    calls = []
    real = Bf16Linear._call
    monkeypatch.setattr(Bf16Linear, "_call", lambda self, rows: calls.append(rows.shape[0]) or real(self, rows))
    exact = linear.matmul(x)
    assert calls == [16, 16, 16]
    calls.clear()
    with bulk_rows():
        bulk = linear.matmul(x)
    assert calls == [40]
    torch.testing.assert_close(bulk.float(), exact.float(), rtol=2e-2, atol=5e-2)
    with pytest.raises(RuntimeError), bulk_rows():
        raise RuntimeError("a failed pass")
    calls.clear()
    assert torch.equal(linear.matmul(x), exact) and calls == [16, 16, 16]

def test_engine_choice_and_clear_refusals():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    assert pick_engine(tiny_model(0)) == "native" and pick_engine(gpt2) == "hf"
    assert make_runner(gpt2).engine == "hf"  # auto falls back
    with pytest.raises(SpecpipeError, match="engine=native cannot run"):
        make_runner(gpt2, engine="native")
    with pytest.raises(SpecpipeError, match="needs the native engine"):
        make_runner(gpt2, precision="w8a16")
    with pytest.raises(SpecpipeError, match="not an engine"):
        make_runner(gpt2, engine="vllm")
    small = make_runner(tiny_model(0), engine="native", cache_len=8)
    with pytest.raises(SpecpipeError, match="cache_len"):
        feed(small, list(range(9)))


@pytest.mark.parametrize("precision", ["none", "fp16", "w8a16"])
def test_memory_figures_match_the_estimate(precision):
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config).eval()
    runner = make_runner(model, engine="native", precision=precision, cache_len=128)
    used = runner.memory()
    assert used.cache == cache_bytes(model.config, precision, 128)
    assert abs(used.weights - weight_bytes(model.config, precision)) < 0.15 * used.weights


@pytest.mark.full  # 37-46 s of torch.compile on 2 cores: CI's time goes to the exactness sets
def test_compiled_stack_equals_eager_and_never_recompiles():  # compile=true's promise
    """One compiled graph serves every block size and cache width of a generation."""
    from specpipe.engine.compile import graphs_compiled

    model = tiny_model(0, dtype=torch.float32)
    eager, compiled = make_runner(model, engine="native"), make_runner(model, engine="native", compile=True)
    feed(compiled, PROMPT[:3])  # the block graph (dynamic shapes) ...
    feed(compiled, [9])  # ... and the one-token graph (dynamo specialises size 1)
    before = graphs_compiled()
    feed(eager, PROMPT[:3]), feed(eager, [9])
    for ids in (PROMPT, [1], [2, 3, 4, 5, 6, 7, 8, 9, 10], [4, 4]):
        torch.testing.assert_close(feed(compiled, ids).logits, feed(eager, ids).logits, rtol=1e-5, atol=1e-5)
    compiled.crop(0, 4)
    eager.crop(0, 4)
    torch.testing.assert_close(feed(compiled, [5, 6, 7]).logits, feed(eager, [5, 6, 7]).logits,
                               rtol=1e-5, atol=1e-5)
    assert graphs_compiled() == before
    assert compiled.lm.stack.compile_s is not None


@CUDA
@pytest.mark.parametrize("precision", ["none", "bf16"])
def test_cuda_matches_cpu(precision):
    model = tiny_model(0, dtype=torch.float32)
    cpu, gpu = make_runner(model, precision=precision), make_runner(model, precision=precision, device="cuda")
    for ids in (PROMPT, [3, 4]):
        torch.testing.assert_close(feed(gpu, ids).logits.cpu(), feed(cpu, ids).logits, rtol=2e-2, atol=2e-2)


@CUDA
def test_cuda_greedy_speculative_equals_plain():
    """The lossless property on the GPU: a draft on CUDA, the target on CUDA, output = plain."""
    from conftest import tiny_target
    from specpipe.controllers.fixed import FixedGamma
    from specpipe.pipeline import Pipeline
    from specpipe.proposers.model_drafter import ModelDrafter
    from specpipe.sampling import SamplingParams
    from specpipe.verifiers.greedy import GreedyVerifier

    target = tiny_target(dtype=torch.float32)
    plain = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, device="cuda"))
    want = plain.run(PROMPT, max_new_tokens=30, speculative=False).token_ids
    draft = ModelDrafter(tiny_model(7, layers=1, dtype=torch.float32), SamplingParams(), device="cuda")
    spec = Pipeline(target, draft, GreedyVerifier(), FixedGamma(3), runner=make_runner(target.model, device="cuda"))
    assert spec.run(PROMPT, max_new_tokens=30).token_ids == want


def test_a_config_read_from_a_gguf_names_no_architecture_but_is_native():
    """A GGUF's config (before the first load writes its dense copy) has no `architectures`:
    its model_type says the class, so engine=native is not refused on a fresh cache."""
    from transformers import LlamaConfig, Qwen2Config

    from specpipe.engine.native_model import config_unsupported_reason

    assert config_unsupported_reason(LlamaConfig(architectures=None)) is None
    assert config_unsupported_reason(Qwen2Config(architectures=None)) is None
    assert "is not a native architecture" in config_unsupported_reason(type("C", (), {"model_type": "gpt2"})())


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_first_divergence_names_the_position_and_the_targets_own_gap(engine):
    """bench's exactness report: where a speculative output parts from plain, and the plain
    target's top-2 logit gap there, measured on the pipeline's own runner (any engine)."""
    from specpipe.exactness import first_divergence
    from specpipe.pipeline import Pipeline
    from specpipe.verifiers.greedy import GreedyVerifier
    from conftest import tiny_target

    target = tiny_target()
    pipe = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, engine=engine))
    plain = pipe.run(PROMPT, max_new_tokens=8, speculative=False).token_ids
    assert first_divergence(pipe.runner, list(PROMPT), plain, plain) is None
    other = [*plain[:3], (plain[3] + 1) % VOCAB, *plain[4:]]
    found = first_divergence(pipe.runner, list(PROMPT), other, plain)
    with torch.no_grad():
        logits = target.model(torch.tensor([[*PROMPT, *plain[:3]]])).logits[0, -1]
    top2 = logits.topk(2).values
    assert (found.index, found.speculative, found.plain) == (3, other[3], plain[3])
    assert found.top2_gap == pytest.approx(float(top2[0] - top2[1]), abs=1e-6)  # compared in float32
    assert pipe.run(PROMPT, max_new_tokens=8, speculative=False).token_ids == plain  # the runner still decodes
