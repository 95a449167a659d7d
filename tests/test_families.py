"""Every decoder family of the native forward against transformers' own, one table of tiny models.

Each family is a tiny random model built from a transformers config (two or three layers, hidden
size 32, vocabulary 64; no downloads), its norms and scales set away from their defaults so that
a norm in the wrong place, a factor left out or a window off by one changes the logits. Windowed
families get a window shorter than the prompt. For each: native logits equal transformers'
(masked attention and row by row); in the exact precisions a verify block's rows are bitwise
one-token rows; greedy n-gram speculation emits plain decoding's tokens; a batch's rows equal
each row alone; the simulated GPU's static step runs it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GraniteConfig, GraniteForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from conftest import VOCAB, assert_tree_rows_equal_paths, feed, tiny_tokenizer
from cuda_sim import simulated_cuda
from specpipe.controllers.fixed import FixedGamma
from specpipe.engine import FINAL, make_runner
from specpipe.engine.native import NativeRunner
from specpipe.engine.native_model import config_unsupported_reason
from specpipe.models.loader import LoadedModel
from specpipe.models.quantize import guarantee, on_kernel
from specpipe.pipeline import Pipeline
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier

WINDOW = 5  # shorter than every prompt below: sliding layers drop the prompt's first keys
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=2, eos_token_id=1,
             pad_token_id=0)

# name: (model class, config); every config differs from Llama's where its family does
FAMILIES = {
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(num_hidden_layers=2, **SIZES)),
    "qwen2-window": (Qwen2ForCausalLM, lambda: Qwen2Config(num_hidden_layers=2, use_sliding_window=True,
                                                           sliding_window=WINDOW, max_window_layers=1, **SIZES)),
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(num_hidden_layers=2, head_dim=16, **SIZES)),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(num_hidden_layers=2, sliding_window=None, **SIZES)),
    "mistral-window": (MistralForCausalLM, lambda: MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SIZES)),
    "gemma3": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(
        num_hidden_layers=3, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=12, final_logit_softcapping=6.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}}, **SIZES)),
    "phi3": (Phi3ForCausalLM, lambda: Phi3Config(
        num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.5}, **SIZES)),
    "granite": (GraniteForCausalLM, lambda: GraniteConfig(
        num_hidden_layers=2, embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3,
        logits_scaling=0.5, **SIZES)),
    "olmo2": (Olmo2ForCausalLM, lambda: Olmo2Config(num_hidden_layers=2, **SIZES)),
    # 8 experts, 2 a token; layer 1 keeps a dense MLP
    "qwen3-moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(
        num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        norm_topk_prob=True, mlp_only_layers=[1], experts_implementation="eager", **SIZES)),  # eager: float64
}
LONG = [5, 17, 33, 2, 9, 41, 12, 30, 7, 8, 22, 50]  # 12 tokens: past the window
REPEATING = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
GREEDY = SamplingParams()
DEEP = (-1, -1, 1, 2, 3, 4, 5, 6, 0, 8)  # a tree 7 deep (past the window) beside a short branch


def tiny(name: str, seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    """The family's tiny model: random weights, its norms' weights random around their identity."""
    cls, config = FAMILIES[name]
    torch.manual_seed(seed)
    model = cls(config()).to(dtype).eval()
    gemma = name.startswith("gemma")
    with torch.no_grad():
        for key, tensor in model.named_parameters():
            if "norm" in key:  # Gemma scales by (1 + w): around 0 there, around 1 elsewhere
                tensor.copy_(torch.rand_like(tensor) * 0.5 + (0.0 if gemma else 0.75))
            elif key.endswith("mlp.gate.weight"):  # a router: distinct, decisive expert choices
                tensor.normal_(0, 1.0)
        model.lm_head.weight.mul_(8.0)  # varied greedy continuations, not one repeated token
    return model


def target(name: str, dtype=torch.float64) -> LoadedModel:
    model = tiny(name, dtype=dtype)
    model.generation_config.eos_token_id = 1
    return LoadedModel("tiny", model, tiny_tokenizer(1))


def transformers_logits(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: transformers' forward over the whole sequence at once (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("exact_rows", [False, True], ids=["masked", "row by row"])
@pytest.mark.parametrize("name", FAMILIES)
def test_native_logits_equal_transformers(name, exact_rows):
    """A prompt past the window, then a 2-token block and one token on the cache, against
    transformers' forward over the whole sequence; attention masked, and row by row as the exact
    precisions attend (the same float64 weights)."""
    model = tiny(name)
    runner = make_runner(model, engine="native")
    assert runner.engine == "native"
    runner.lm.exact = exact_rows
    want = transformers_logits(model, LONG + [3, 60, 9])
    got = torch.cat([feed(runner, ids).logits[0] for ids in (LONG, [3, 60], [9])])
    # transformers computes RMSNorm in float32 even for float64 models: agreement to ~1e-6
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_hidden_states_equal_transformers_on_its_own_cache(name):
    """What heads read (a layer's output, the final norm's) and the logits, against engine=hf:
    transformers' forward on its own cache (sliding layers keep their window there), a prompt
    and then steps."""
    model = tiny(name)
    hf, native = make_runner(model, engine="hf"), make_runner(model, engine="native")
    for ids in (LONG, [3, 60], [9]):
        want, got = feed(hf, ids, hidden=(0, FINAL)), feed(native, ids, hidden=(0, FINAL))
        torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=2e-5)
        for key in (0, FINAL):
            torch.testing.assert_close(got.hidden[key], want.hidden[key], rtol=0, atol=2e-5)


@pytest.mark.parametrize("precision", ["bf16", "w8a16", "w8a8"])
@pytest.mark.parametrize("name", FAMILIES)
def test_exact_verify_rows_are_bitwise_one_token_rows(name, precision):
    """After a prompt past the window, every row of a 2-, 5- and 9-token block is bitwise the
    row of one-token forwards; in w8a8 (specpipe's C kernel) through the kernel's fused stack
    where the layer is Llama's (folded factors included), through the torch stack elsewhere."""
    if guarantee(precision) != "exact":  # bf16 on AVX512-BF16 CPUs without AMX, as `specpipe check` says
        pytest.skip(f"{precision} is `tolerance` on this CPU: its rows are not bitwise across block sizes")
    if precision == "w8a8" and not on_kernel(precision):
        pytest.skip("specpipe's C kernel does not build here")
    runner = make_runner(tiny(name).float(), engine="native", precision=precision)
    if precision == "w8a8":  # partial rotary (this Phi-3), windows, norms elsewhere: not the kernel's layer
        assert (runner.lm.fused is not None) == (name in ("llama", "mistral", "granite"))
        assert runner.memory().weights > 0  # every kernel counted, a sparse block's experts too
    block = [20, 21, 22, 23, 24, 25, 26, 27, 28]
    feed(runner, LONG)
    singles = torch.cat([feed(runner, [t]).logits[0] for t in block])  # [9, V]
    for k in (2, 5, 9):
        runner.crop(0, len(LONG))
        assert torch.equal(feed(runner, block[:k]).logits[0], singles[:k]), k


@pytest.mark.parametrize("name", FAMILIES)
def test_tree_rows_deeper_than_the_window_equal_their_paths(name):
    """A tree block whose deepest rows have ancestors outside their window (keys placed by their
    depth, not their block slot): masked rows within float64 rounding of one-token forwards
    along their paths, and in w8a16 (row by row) bitwise equal to them."""
    model = tiny(name)
    runner, tokens = make_runner(model, engine="native"), list(range(30, 30 + len(DEEP)))
    feed(runner, LONG[:-1])
    rows = feed(runner, [LONG[-1], *tokens], tree=DEEP).logits[0]
    for node in range(len(DEEP) + 1):  # row 0: the context's last token; row i: node i - 1
        path, at = [], node - 1
        while at >= 0:
            path.insert(0, tokens[at])
            at = DEEP[at]
        runner.crop(0, len(LONG) - 1)
        torch.testing.assert_close(rows[node], feed(runner, [LONG[-1], *path]).logits[0, -1], rtol=0, atol=1e-10)
    assert_tree_rows_equal_paths(make_runner(model.float(), engine="native", precision="w8a16"), LONG, tokens, DEEP)


@pytest.mark.parametrize("name", FAMILIES)
def test_static_tree_rows_deeper_than_the_window_equal_the_eager_rows(name):
    """The static step's tree block (`kernels=fast`: its mask built on the device from the rows'
    lengths and the tree's depths) against the eager forward's, to float64 rounding."""
    model = tiny(name)
    eager, fixed = make_runner(model, engine="native"), make_runner(model, engine="native", graphs="on", kernels="fast")
    fixed.plan(len(DEEP) + 1)
    block = [LONG[-1], *range(30, 30 + len(DEEP))]
    for runner in (eager, fixed):
        feed(runner, LONG[:-1])
    got, want = feed(fixed, block, tree=DEEP), feed(eager, block, tree=DEEP)
    assert any(shape.tree for shape in fixed.static.shapes)  # the static tree shape ran
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-10)


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_speculation_is_plain_decoding(name, proposer):
    """n-gram lookup, and a draft model of the same family (the target's weights in float32, on a
    native runner of its own): greedy output equal to plain decoding's, drafts proposed and kept."""
    tgt = target(name)
    drafter = NgramProposer(ngram_min=1) if proposer == "ngram" else \
        ModelDrafter(tiny(name, dtype=torch.float32), GREEDY, engine="native")
    pipe = Pipeline(tgt, drafter, GreedyVerifier(), FixedGamma(3), sampling=GREEDY,
                    runner=make_runner(tgt.model, engine="native"))
    runs = [pipe.run(prompt, max_new_tokens=32) for prompt in (REPEATING, LONG + LONG[:6])]
    plain = [pipe.run(prompt, max_new_tokens=32, speculative=False) for prompt in (REPEATING, LONG + LONG[:6])]
    assert [run.token_ids for run in runs] == [run.token_ids for run in plain]
    assert sum(sum(run.stats.drafted_at) for run in runs) > 0 and sum(sum(run.stats.accepted_at) for run in runs) > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_eagle3_head_in_the_speculators_format_is_plain_decoding(name, tmp_path):
    """A random EAGLE-3 head of the family target's shape, saved and read back as a speculators
    checkpoint, reading the target's inner layers, embeddings and LM head through the runner:
    greedy output equal to plain decoding's, drafts proposed (a random head's are rarely kept)."""
    from specpipe.heads.eagle3 import Eagle3Head, Eagle3Shape
    from specpipe.heads.speculators import load_eagle3, save_eagle3
    from specpipe.proposers.eagle3 import proposer_for

    tgt = target(name)
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Shape.of_target(tgt.model.config, VOCAB))
    with torch.no_grad():
        for key, weight in head.named_parameters():
            weight.normal_(1.0 if "norm" in key else 0.0, 0.3)
    head.set_vocabulary(torch.arange(VOCAB))
    save_eagle3(head, tmp_path / "head", target="tiny")
    pipe = Pipeline(tgt, proposer_for(load_eagle3(tmp_path / "head").double().eval(), GREEDY), GreedyVerifier(),
                    FixedGamma(3), sampling=GREEDY, runner=make_runner(tgt.model, engine="native"))
    run = pipe.run(LONG, max_new_tokens=16)
    assert run.token_ids == pipe.run(LONG, max_new_tokens=16, speculative=False).token_ids
    assert sum(run.stats.drafted_at) > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_batch_rows_equal_each_row_alone(name):
    """Ragged rows (their own lengths, one past the window) in one batch, each equal to that
    sequence decoded alone."""
    model = tiny(name, seed=1)
    prefixes = torch.tensor([LONG[:8], [7, 8, 9, 10, 11, 12, 13, 14], [60, 1, 2, 3, 4, 5, 6, 7]])
    batch = NativeRunner(model, rows=3)
    batch.forward(prefixes)
    lengths = [8, 4, 2]
    batch.commit(lengths)
    new = torch.tensor([[20, 21, 22], [30, 31, 32], [40, 41, 42]])
    out = batch.forward(new)
    for row in range(3):
        alone = make_runner(model, engine="native")
        want = feed(alone, prefixes[row, : lengths[row]].tolist() + new[row].tolist()).logits[0, -3:]
        torch.testing.assert_close(out.logits[row], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", FAMILIES)
def test_static_steps_run_each_family_on_a_simulated_gpu(name):
    """The static step (fixed shapes, masks built on the device, `kernels=exact`) on the simulated
    GPU, with n-gram drafts and with a draft model of the family (its own static steps,
    `kernels=fast`): nothing a GPU would refuse, greedy output equal to plain decoding's, drafts kept."""
    tgt = target(name)
    with simulated_cuda() as refused:
        runner = make_runner(tgt.model, device="cuda", graphs="on")
        pipe = Pipeline(tgt, NgramProposer(ngram_min=1), GreedyVerifier(), FixedGamma(3), sampling=GREEDY,
                        runner=runner)
        run = pipe.run(LONG + LONG[:6], max_new_tokens=32)
        plain = pipe.run(LONG + LONG[:6], max_new_tokens=32, speculative=False)
        drafter = ModelDrafter(tiny(name, dtype=torch.float32), GREEDY, device="cuda", graphs="on")
        drafted = Pipeline(tgt, drafter, GreedyVerifier(), FixedGamma(3), sampling=GREEDY,
                           runner=runner).run(LONG, max_new_tokens=16)
        short = pipe.run(LONG, max_new_tokens=16, speculative=False)
    assert refused == [] and pipe.runner.step == "static exact" and drafter.runner.step == "static fast"
    assert run.token_ids == plain.token_ids and sum(run.stats.accepted_at) > 0
    assert drafted.token_ids == short.token_ids and sum(drafted.stats.accepted_at) > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_the_config_alone_says_native(name):
    assert config_unsupported_reason(FAMILIES[name][1]()) is None


def test_check_names_the_family_or_the_reason_it_falls_back(tmp_path):
    """`specpipe check` on model folders, from their configs: the native family that runs one, and
    for a config the native forward cannot run, the engine it falls back to and why."""
    from test_cli import specpipe

    softcapped = Gemma3TextConfig(**{**SIZES, "num_hidden_layers": 2, "head_dim": 8, "attn_logit_softcapping": 50.0})
    for folder, model in (("gemma", tiny("gemma3", dtype=torch.float32)), ("capped", Gemma3ForCausalLM(softcapped))):
        model.save_pretrained(tmp_path / folder)
        tiny_tokenizer(1).save_pretrained(tmp_path / folder)
    native = specpipe("check", f"model={tmp_path / 'gemma'}", "proposer=ngram")
    assert native.returncode == 0, native.stderr
    assert "native (Gemma3ForCausalLM)" in " ".join(native.stdout.split())
    fallback = specpipe("check", f"model={tmp_path / 'capped'}", "proposer=ngram")
    assert fallback.returncode == 0, fallback.stderr
    assert "hf: transformers eager on a DynamicCache (attention logit softcapping" in " ".join(fallback.stdout.split())


def test_models_lists_the_native_families(tmp_path):
    from test_cli import specpipe

    result = specpipe("models", env={"SPECPIPE_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    shown = "".join(result.stdout.split())
    assert all(cls.__name__ in shown for cls, _ in FAMILIES.values())


@pytest.mark.parametrize("name", FAMILIES)
def test_memory_estimate_from_the_config_matches_what_the_runner_holds(name):
    """`specpipe check`'s estimate (footprint.py, config alone) against the runner's weights: a
    sparse block's experts counted, not its unused dense size."""
    from specpipe.engine.footprint import weight_bytes

    runner = make_runner(tiny(name, dtype=torch.float32), engine="native", cache_len=32)  # small rotary tables
    used = runner.memory().weights
    assert abs(used - weight_bytes(runner.model.config, "none")) < 0.06 * used  # dense MLPs for the MoE: 8.6% off


def test_heads_score_with_the_targets_soft_capped_logits():
    """Gemma's `final_logit_softcapping` (6.0 in the tiny config) where heads read the target's LM
    head: the runner's `lm_head` over the final norm's output is its forward's logits, capped; the
    rows of `lm_head_weight` alone are not, and `CappedRows` over them
    with the config's cap gives the forward's logits of those tokens (a draft vocabulary's scores)."""
    from types import SimpleNamespace

    from specpipe.heads.logits import CappedRows, final_softcap

    model = tiny("gemma3")
    cap = final_softcap(model.config)
    runner = make_runner(model, engine="native")
    assert cap == 6.0 and runner.lm.softcap == cap
    out = feed(runner, LONG, hidden=(FINAL,))
    features, logits = out.hidden[FINAL][0], out.logits[0]  # [12, H], [12, V]
    assert logits.abs().max() < cap
    torch.testing.assert_close(runner.lm_head(features), logits, rtol=0, atol=1e-12)
    ids = torch.tensor([3, 9, 17, 60])
    rows = torch.nn.Linear(32, len(ids), bias=False).double()
    with torch.no_grad():
        rows.weight.copy_(runner.lm_head_weight()[ids])
        raw = rows(features)  # uncapped: the rows alone are not the model's logits
        assert (raw - logits[:, ids]).abs().max() > 0.1
        torch.testing.assert_close(CappedRows(rows, cap)(features), logits[:, ids].float(), rtol=0, atol=1e-5)
    # a config without the cap (Gemma 3's own) leaves the rows' scores as they are; a multimodal
    # config's text part is read
    assert final_softcap(LlamaConfig()) is None and CappedRows(rows, None).cap is None
    assert final_softcap(SimpleNamespace(text_config=SimpleNamespace(final_logit_softcapping=30.0))) == 30.0
