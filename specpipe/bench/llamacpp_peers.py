"""Peers on llama.cpp: llama-cpp-python's own decoding of the target's GGUF file, as baselines in
the bench table (the `llamacpp` extra; `specpipe install llamacpp`).

- `llama-cpp`: `Llama.generate` greedy, one token per evaluation: llama.cpp's plain decoding.
- `llama-cpp-lookup`: the same with llama-cpp-python's own speculative decoding
  (`LlamaPromptLookupDecoding`, prompt lookup with γ tokens and `proposer.ngram_max`, else 2).

Both run llama.cpp's defaults (f16 KV cache, repacked weights, flash attention as llama.cpp's
CLI picks it on the CPU) on as many threads as specpipe's llamacpp engine, and start each
prompt from an empty cache (no prefix reuse between prompts or repeats). Their tokens/s counts
decoding after the first new token (the prompt's evaluation and first token excluded), as
specpipe's own tokens/s counts decoding after its prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from specpipe.errors import SpecpipeError

PEERS = ("llama-cpp", "llama-cpp-lookup")


def _gguf(pipeline) -> Path:
    source = pipeline.target.source
    if source is None or source.gguf is None:
        raise SpecpipeError(f"peer=llama-cpp runs the target's GGUF file, and model '{pipeline.target.name}' has none. "
                            "Pass a zoo name or a .gguf file, or drop the llama-cpp peers.")
    return Path(source.path) / source.gguf


def _llama(pipeline, draft=None):
    from specpipe.engine.llamacpp import library, threads

    library()  # the install advice when llama-cpp-python is missing
    from llama_cpp import Llama

    limit = pipeline.context_limit()
    return Llama(str(_gguf(pipeline)), n_ctx=limit.tokens if limit else 2048, n_threads=threads(),
                 n_threads_batch=threads(), flash_attn=True, draft_model=draft, verbose=False)


def _generate(llm, eos: set[int]) -> Callable[..., tuple[list[int], float]]:
    """(ids, max_new_tokens, seed) -> (new tokens, seconds from the first new token to the last)."""
    def generate(ids: list[int], max_new_tokens: int, seed: int) -> tuple[list[int], float]:
        llm.reset()  # an empty cache: the prompt is evaluated again, as specpipe's runs do
        new, first = [], None
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            first = first or time.perf_counter()  # the prompt is evaluated and the first token out
            new.append(token)
            if token in eos or len(new) == max_new_tokens:
                break
        return new, time.perf_counter() - first

    return generate


def plain(pipeline, cfg) -> Callable[..., list[int]]:
    _greedy_only(pipeline)
    return _generate(_llama(pipeline), pipeline.eos_ids)


def lookup(pipeline, cfg) -> Callable[..., list[int]]:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    _greedy_only(pipeline)
    ngram = int(cfg.proposer.ngram_max) if "ngram_max" in cfg.proposer else 2
    draft = LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=max(int(cfg.gamma), 1))
    return _generate(_llama(pipeline, draft), pipeline.eos_ids)


def _greedy_only(pipeline) -> None:
    if not pipeline.sampling.greedy:
        raise SpecpipeError("the llama-cpp peers decode greedily (their samplers draw other random numbers than "
                            "specpipe's): use temperature=0 with them, or drop the peer.")
