"""specpipe's C kernel (models/cpu_kernels.c): its linears against references written here, every
row of a k-row call bitwise equal to a one-row call, and the fused native forward (engine/
native_fused.py) against transformers, with verify blocks, trees and batches bitwise equal to
one-token steps; greedy speculation on it equals plain decoding.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import PROMPT, tiny_target
from specpipe.engine.native_model import NativeLM
from specpipe.models import cpu_kernels
from specpipe.models.quantize import KernelLinear, guarantee, kernel_name, linear_kernel

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None,
                                reason=f"specpipe's C kernel cannot be built here: {cpu_kernels.unavailable()}")

KINDS = {"fp16": cpu_kernels.W_F16, "w8a32": cpu_kernels.W_I8, "w8a8": cpu_kernels.W_Q8, "w4a8": cpu_kernels.W_Q4}
SHAPES = [(7, 20), (64, 64), (130, 70), (96, 200), (576, 256)]  # tails of every tile, vector and group


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=generator) * 0.05, torch.randn(n, generator=generator)


def _q8_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """w8a8 written out in float64: rows rounded to int8 per 64 values (absmax / 127, half away
    from zero, computed in float32 as the kernel does), integer products, group scales."""
    m, k = x.shape
    total = torch.zeros(m, weight.shape[0], dtype=torch.float64)
    for first in range(0, k, 64):
        part = x[:, first : first + 64]
        top = part.abs().amax(1, keepdim=True)  # [M, 1]
        inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
        v = part * inv
        q = torch.where(v >= 0, v + 0.5, v - 0.5).trunc()
        total += (q.double() @ weight[:, first : first + 64].double().T) * (top.double() / 127.0)
    return total * scale.double() + bias.double()


@pytest.mark.parametrize("mode", KINDS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_linear_matches_a_reference_and_adds_in_place(mode, n, k):
    weight, bias = _weights(n, k)
    layer = KernelLinear(weight, bias, KINDS[mode])
    x = torch.randn(9, k)
    dense = layer.dense_weight()  # the weights as stored (fp16, or int8 times its scale)
    if mode == "w8a8":
        expected = _q8_reference(x, dense / layer.scale[:, None], layer.scale, bias)
    elif mode == "w4a8":  # d q + m per group: the same integer-times-scale sums over the dequantized weight
        expected = _q8_reference(x, dense, torch.ones(n), bias)
    else:
        expected = x.double() @ dense.double().T + bias.double()
    y = layer.matmul(x)
    assert torch.allclose(y.double(), expected, atol=1e-4, rtol=1e-4)
    assert (dense - weight).abs().max() < (0.1 if mode == "w4a8" else 0.05) * weight.abs().max()  # close to what was given
    residual = torch.randn(9, n)
    added = layer.matmul_add(x, residual.clone())
    assert torch.equal(added, residual + y)


@pytest.mark.parametrize("mode", KINDS)
def test_every_row_is_bitwise_a_one_row_call(mode):
    weight, bias = _weights(200, 1536)
    layer = KernelLinear(weight, bias, KINDS[mode])
    x = torch.randn(17, 1536)
    alone = torch.cat([layer.matmul(x[i : i + 1].contiguous()) for i in range(17)])
    for rows in range(1, 18):
        assert torch.equal(layer.matmul(x[:rows].contiguous()), alone[:rows]), rows


def test_4_bit_packing_round_trips():
    weight = torch.randn(130, 70)
    packed = cpu_kernels.pack_q4(weight)
    dense = cpu_kernels.unpack_q4(packed, 130, 70)
    blocks = torch.nn.functional.pad(weight, (0, 58)).reshape(130, 4, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15  # [130, 4]: each block's grid
    error = torch.nn.functional.pad(dense - weight, (0, 58)).abs().reshape(130, 4, 32)
    fp16 = 2.0**-10 * (15 * step + blocks.amin(-1).abs())  # d and m are stored in float16
    assert (error <= step[..., None] / 2 + fp16[..., None] + 1e-6).all()
    assert torch.equal(cpu_kernels.pack_q4(dense), packed)  # the grid's own values pack back to the same bytes


@pytest.mark.parametrize("mode", ["fp16", "w8a32", "w8a8"])
def test_packing_round_trips(mode):
    kind = KINDS[mode]
    weight = torch.randint(-127, 128, (130, 70), dtype=torch.int8)
    if kind == cpu_kernels.W_F16:
        weight = torch.randn(130, 70).half()
    packed, _ = cpu_kernels.pack(weight, kind)
    assert torch.equal(cpu_kernels.unpack(packed, kind, 130, 70), weight)


def _tiny(family: str):
    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        return LlamaForCausalLM(config).eval()
    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return Qwen2ForCausalLM(config).eval()  # q/k/v with biases


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", KINDS)
def test_fused_forward_is_transformers_and_its_blocks_are_one_token_steps(family, mode):
    model = _tiny(family)
    lm = NativeLM(model, mode, 128)
    assert lm.fused is not None
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    logits, hidden = lm.forward(ids, [0], lm.new_cache(1, 128), hidden=(1, -1))
    with torch.no_grad():
        reference = model(ids, output_hidden_states=True)
    tolerance = {"fp16": 1e-3, "w4a8": 0.2}.get(mode, 5e-2)  # fp16 weights; int8 rounding; 4-bit
    assert (logits - reference.logits).abs().max() < tolerance
    assert (hidden[1] - reference.hidden_states[2]).abs().max() < tolerance * 10
    cache = lm.new_cache(1, 128)
    lm.forward(ids[:, :4], [0], cache)
    singles = torch.cat([lm.forward(ids[:, i : i + 1], [i], cache)[0] for i in range(4, 12)], 1)  # [1, 8, V]
    for k in (2, 5, 8):
        block = lm.forward(ids[:, 4 : 4 + k], [4], cache)[0]
        assert torch.equal(block, singles[:, :k]), k
    # a tree: row 0, two children of it, a grandchild under the first: the path 0 -> 1 -> 3 is the chain
    tree_ids = torch.tensor([[ids[0, 4], ids[0, 5], 7, ids[0, 6]]])
    rows = lm.forward(tree_ids, [4], cache, tree=torch.tensor([[-1, -1, 0]]))[0]  # the draft's parents [1, N]
    assert torch.equal(rows[0, [0, 1, 3]], singles[0, :3])
    # two batch rows at other lengths, each as it is alone
    both = lm.new_cache(2, 128)
    lm.forward(ids[:, :4], [0], both.row(0))
    lm.forward(ids[:, :6], [0], both.row(1))
    batch = lm.forward(torch.stack([ids[0, 4:7], ids[0, 6:9]]), [4, 6], both)[0]
    assert torch.equal(batch[0], singles[0, :3]) and torch.equal(batch[1], singles[0, 2:5])


@pytest.mark.parametrize("mode", ["fp16", "w8a8", "w4a8"])
@pytest.mark.parametrize("drafter", ["ngram", "twin"])
def test_greedy_speculation_on_the_kernel_is_plain_decoding(mode, drafter):
    from specpipe.controllers.fixed import FixedGamma
    from specpipe.engine import make_runner
    from specpipe.pipeline import Pipeline
    from specpipe.proposers.model_drafter import ModelDrafter
    from specpipe.proposers.ngram import NgramProposer
    from specpipe.sampling import SamplingParams
    from specpipe.verifiers.greedy import GreedyVerifier

    target = tiny_target(dtype=torch.float32)
    runner = make_runner(target.model, engine="native", precision=mode)
    assert runner.lm.fused is not None
    proposer = (NgramProposer(ngram_max=4, ngram_min=1) if drafter == "ngram"
                else ModelDrafter(target.model, SamplingParams(temperature=0.0), precision="int8"))
    pipeline = Pipeline(target, proposer, GreedyVerifier(), FixedGamma(4), runner=runner)
    prompt = [*PROMPT, *PROMPT, *PROMPT]  # repeats: the lookup finds drafts
    spec = pipeline.run(prompt, max_new_tokens=40)
    plain = pipeline.run(prompt, max_new_tokens=40, speculative=False)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) > 10
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0


def test_check_names_the_kernel_and_its_guarantee():
    assert guarantee("fp16") == "exact" and guarantee("w8a8") == "exact"
    assert guarantee("fp16", native=False) == "tolerance"  # transformers' attention takes blocks at once
    assert "specpipe C kernel" in kernel_name("w8a8") and kernel_name("w8a8").endswith("exact")
    assert isinstance(linear_kernel(torch.randn(8, 16), None, "fp16"), KernelLinear)


def test_without_the_kernel_fp16_falls_back_and_w8a8_is_refused(monkeypatch):
    from specpipe.errors import SpecpipeError
    from specpipe.models.quantize import Fp16Linear

    monkeypatch.setenv("SPECPIPE_CPU_KERNELS", "0")
    cpu_kernels._load.cache_clear()
    try:
        assert "SPECPIPE_CPU_KERNELS=0" in cpu_kernels.unavailable()
        assert isinstance(linear_kernel(torch.randn(8, 16), None, "fp16"), Fp16Linear)
        assert guarantee("fp16") == "tolerance"
        with pytest.raises(SpecpipeError, match="w8a8 runs on specpipe's C kernel"):
            linear_kernel(torch.randn(8, 16), None, "w8a8")
    finally:
        monkeypatch.delenv("SPECPIPE_CPU_KERNELS")
        cpu_kernels._load.cache_clear()


def test_bf16_is_called_exact_only_where_its_rows_are_bitwise(monkeypatch):
    from specpipe.models import quantize

    monkeypatch.setattr(quantize, "bf16_exact", lambda: False)
    assert guarantee("bf16") == "tolerance"
    monkeypatch.setattr(quantize, "bf16_exact", lambda: True)
    assert guarantee("bf16") == "exact"


def test_auto_keeps_a_4_bit_file_at_4_bits_on_the_cpu(tmp_path):
    from specpipe.config import compose
    from specpipe.models.loader import four_bit_source
    from specpipe.models.quantize import resolve_precision

    assert four_bit_source("smollm2-135m") and four_bit_source("qwen2.5-coder-1.5b")
    assert not four_bit_source("someone/some-model") and not four_bit_source(str(tmp_path))
    assert compose(["model=smollm2-135m"]).model.quantize == "w4a8"
    assert compose(["model=smollm2-135m", "engine=hf"]).model.quantize == "fp16"  # transformers' head stays wide
    assert compose(["model=smollm2-135m", "model.quantize=fp16"]).model.quantize == "fp16"  # a choice is kept
    assert compose(["model=someone/some-model", "model.quantize=auto"]).model.quantize == "fp16"
    assert resolve_precision("auto", "cuda", four_bit=True) == "bf16"
    assert resolve_precision("auto", "cpu", draft=True, four_bit=True) == "fp16"  # drafts: their own default


@pytest.mark.parametrize("mode", ["fp16", "w8a8"])
def test_the_torch_forward_on_the_kernels_linears_stays_exact(mode):
    """Without the fused stack (compile=true runs torch.compile's instead), the kernel's linears
    and row-by-row attention keep a verify block's rows bitwise the one-token rows."""
    lm = NativeLM(_tiny("llama"), mode, 128)
    lm.fused = None
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(2))
    cache = lm.new_cache(1, 128)
    lm.forward(ids[:, :4], [0], cache)
    singles = torch.cat([lm.forward(ids[:, i : i + 1], [i], cache)[0] for i in range(4, 12)], 1)
    assert torch.equal(lm.forward(ids[:, 4:12], [4], cache)[0], singles)


def test_resident_weights_are_copies_in_their_own_mapping():
    packed = torch.randint(-127, 128, (3 * cpu_kernels.HUGE_PAGE + 100,), dtype=torch.int8)
    small = torch.randn(1000)
    assert cpu_kernels.resident(small) is small  # under a huge page: left where it is
    first, second = cpu_kernels.resident(packed), cpu_kernels.resident(packed[:-100].view(torch.int32))
    assert torch.equal(first, packed) and torch.equal(second, packed[:-100].view(torch.int32))
    assert first.data_ptr() != packed.data_ptr() and first.data_ptr() % 64 == second.data_ptr() % 64 == 0
    assert second.data_ptr() >= first.data_ptr() + first.numel() or second.data_ptr() + second.numel() * 4 <= first.data_ptr()
    packed.zero_()
    assert first.abs().sum() > 0  # a copy, not a view of what was packed
