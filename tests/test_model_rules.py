"""Rules outside the engine (the target's early exit, adapters, its precision's kernel, a GPU's
precisions; a twin or layer features on llama.cpp) are one function each in the module they
concern: `specpipe check` reports its refusal and the code that loads the model raises it, in
the same words."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_model
from specpipe.checks.target import check_early_exit, check_lora, check_precision
from specpipe.errors import Refusal, SpecpipeError
from specpipe.models import cpu_kernels
from specpipe.models.adapters import apply_early_exit, apply_lora, early_exit_refusal, lora_refusal
from specpipe.models.quantize import cuda_refusal, kernel_refusal, linear_kernel


def raised(call) -> str:
    with pytest.raises(SpecpipeError) as caught:
        call()
    return str(caught.value)


def reported(check) -> str:
    """The sentence a check's row makes (as the run words a refusal)."""
    assert check.status == "refuse", check
    return str(Refusal(check.why, check.fix))


@pytest.mark.parametrize("layers", [0, 3, -1])
def test_early_exit_is_refused_in_the_same_words(layers):
    model = tiny_model(seed=0, layers=2)
    settings = SimpleNamespace(early_exit=layers, target_config=model.config, proposer="none")
    message = raised(lambda: apply_early_exit(model, layers))
    assert message == reported(check_early_exit(settings)) == str(early_exit_refusal(layers, 2))
    assert f"model.early_exit={layers}" in message and "2 layers" in message


def test_early_exit_in_range_passes_both():
    model = tiny_model(seed=0, layers=2)
    assert early_exit_refusal(1, 2) is None
    assert check_early_exit(SimpleNamespace(early_exit=1, target_config=model.config, proposer="none")).status == "ok"
    assert len(apply_early_exit(model, 1).get_decoder().layers) == 1


def test_a_folder_without_an_adapter_is_refused_in_the_same_words(tmp_path):
    settings = SimpleNamespace(lora=[str(tmp_path)], proposer="ngram", declaration=SimpleNamespace(draft_model=None))
    message = raised(lambda: apply_lora(tiny_model(seed=0), [str(tmp_path)]))
    assert message == reported(check_lora(settings)) == str(lora_refusal([str(tmp_path)]))
    assert str(tmp_path) in message and "adapter_config.json" in message
    (tmp_path / "adapter_config.json").write_text("{}")
    assert lora_refusal([str(tmp_path)]) is None


def test_a_kernel_precision_without_the_kernel_is_refused_in_the_same_words(monkeypatch):
    monkeypatch.setenv("SPECPIPE_CPU_KERNELS", "0")
    cpu_kernels._load.cache_clear()
    try:
        settings = SimpleNamespace(precision="w4a8", device="cpu", draft=SimpleNamespace(precision=None))
        message = raised(lambda: linear_kernel(torch.randn(8, 64), None, "w4a8"))
        assert message == reported(check_precision(settings)[0]) == str(kernel_refusal("w4a8"))
        assert "SPECPIPE_CPU_KERNELS=0" in message
        assert kernel_refusal("fp16") is None  # fp16 falls back to torch's kernel
    finally:
        monkeypatch.delenv("SPECPIPE_CPU_KERNELS")
        cpu_kernels._load.cache_clear()
    assert kernel_refusal("w4a8") is None  # the kernel runs on this machine again


def test_only_dense_precisions_run_on_a_gpu():
    assert cuda_refusal("bf16") is None and cuda_refusal("none") is None
    refusal = cuda_refusal("w8a16")
    assert refusal is not None and "model.quantize=w8a16 runs on CPU kernels only" in str(refusal)


def test_a_twin_on_llamacpp_without_its_gguf_is_refused_in_the_same_words():
    from omegaconf import OmegaConf

    from specpipe.checks.llamacpp import _proposer
    from specpipe.engine.llamacpp import twin_refusal
    from specpipe.proposers.twin import build

    settings = SimpleNamespace(declaration=SimpleNamespace(hidden=None, draft_model="target"), proposer="twin",
                               draft=SimpleNamespace(model=None, precision=None), tree_option=False, tree_auto=False)
    rows = _proposer(OmegaConf.create({"proposer": {"name": "twin"}}), settings)
    message = raised(lambda: build(context=SimpleNamespace(engine="llamacpp")))
    assert message == reported(rows[0]) == str(twin_refusal(None))
    assert twin_refusal("twin.Q2_K.gguf") is None


def test_layer_features_on_llamacpp_are_refused_in_the_same_words():
    """EAGLE-3 reads several target layers; llama.cpp hands over the final norm's output only:
    `check` refuses the proposer, and the runner, asked for a layer anyway, raises the same rule."""
    from omegaconf import OmegaConf

    from specpipe.checks.llamacpp import _proposer
    from specpipe.engine.llamacpp import hidden_refusal

    settings = SimpleNamespace(declaration=SimpleNamespace(hidden="layers", draft_model=None), proposer="eagle3",
                               draft=SimpleNamespace(model=None, precision=None), tree_option=False, tree_auto=False)
    rows = _proposer(OmegaConf.create({"proposer": {"name": "eagle3"}}), settings)
    assert reported(rows[0]) == str(hidden_refusal(True, "proposer=eagle3"))
    assert "final norm's output" in rows[0].why and "engine=native" in rows[0].fix
    assert hidden_refusal(False) is None


def test_greedy_at_a_temperature_is_refused_in_the_same_words():
    from omegaconf import OmegaConf

    from specpipe.checks.proposer import check_sampling
    from specpipe.sampling import SamplingParams
    from specpipe.verifiers.greedy import build, temperature_refusal

    settings = SimpleNamespace(temperature=0.8, tree_option=False)
    row = check_sampling(OmegaConf.create({"verifier": {"_target_": "specpipe.verifiers.greedy.build"}}), settings)
    message = raised(lambda: build(context=SimpleNamespace(sampling=SamplingParams(temperature=0.8))))
    assert message == reported(row) == str(temperature_refusal(0.8))
    assert temperature_refusal(0.0) is None


def test_a_gpu_eager_tree_is_reported_within_tolerance():
    """A GPU's eager step verifies a tree through its mask in one call (no read of the parents):
    check says tolerance there; the CPU reads the parents for free and keeps rows exact."""
    from specpipe.checks.target import _guarantee

    tree = _guarantee("bf16", "cuda", False, "exact", trees=True)
    assert tree.why.startswith("tolerance (bf16, eager, tree drafts)") and "proposer.tree=null" in tree.fix
    assert _guarantee("bf16", "cuda", False, "exact").why.startswith("bf16: every row of a verify block is bitwise")
    assert "bitwise" in _guarantee("fp16", "cpu", False, "exact", trees=True).why
