"""Peers: transformers' own speculative decoding on the same models and prompts, as extra
baselines in the bench table.

- `hf-plain`: plain `generate`, transformers' default dynamic cache: its baseline as users run it.
- `hf-static`: `generate(cache_implementation="static")`, which transformers compiles itself
  (`torch.compile` of the forward, its default `CompileConfig`: fullgraph, "reduce-overhead",
  so CUDA graphs) on a GPU, and runs uncompiled on the CPU: its fastest plain decoding.
- `hf-assisted`: `generate(assistant_model=...)` with the proposer's own draft model (the
  draft or twin, at the precision specpipe uses), transformers' default assistant schedule; a
  draft with another tokenizer runs as transformers' universal assisted generation.
- `hf-prompt-lookup`: `generate(prompt_lookup_num_tokens=γ)`, transformers' n-gram lookup
  (max_matching_ngram_size from `proposer.ngram_max` when the proposer is ngram).
- `auto`: the counterpart the proposer declares (`DECLARATION.peer`: draft, twin: hf-assisted;
  ngram: hf-prompt-lookup; the others none).
- `llama-cpp`, `llama-cpp-lookup`: llama.cpp's own plain decoding and prompt lookup on the
  target's GGUF (bench/llamacpp_peers.py).
- `hf-batched` (a request load, `requests=`): transformers' plain batched `generate`, static
  batches of `concurrency` requests, left-padded (its assisted generation refuses batches).

They run transformers' own model objects at the precision specpipe uses (with the native engine,
the transformers model the native weights came from, quantized the same way), on the runner's
device, so they measure transformers' decoding, not specpipe's engine.
transformers' tokens/s counts the whole `generate` call (it has no separate prefill timer), which
slightly favours specpipe on long prompts; the table says so. llama.cpp's counts decoding after
the first new token, as specpipe's does after its prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.bench import llamacpp_peers
from specpipe.bench.llamacpp_peers import PEERS as LLAMA_CPP_PEERS
from specpipe.bench.records import Measured
from specpipe.checks.identity import proposer_kind
from specpipe.declaration import declaration_of
from specpipe.errors import SpecpipeError
from specpipe.models.quantize import quantize_model

PEERS = ("hf-plain", "hf-static", "hf-assisted", "hf-prompt-lookup", *LLAMA_CPP_PEERS)
LOAD_PEERS = ("hf-batched",)  # peers of a request load (`requests=`): transformers batches plain decoding only


@dataclass
class Peer:
    name: str
    generate: Callable[..., list[int]]  # (input_ids, max_new_tokens, seed) -> new token ids
    # or, timed: -> (new token ids, seconds from the first new token to the last), decode alone
    timed: bool = False

    def run(self, ids: list[int], max_new_tokens: int, seed: int) -> Measured:
        start = time.perf_counter()
        if not self.timed:
            new = self.generate(ids, max_new_tokens, seed)
            return Measured(new, len(new) / (time.perf_counter() - start))
        new, decode_s = self.generate(ids, max_new_tokens, seed)
        return Measured(new, (len(new) - 1) / decode_s if decode_s > 0 else 0.0)


def peer_names(value, proposer, engine: str = "auto") -> list[str]:
    """`peer=` as given (None, one name, a list, or `auto`: the counterpart the proposer node
    declares, so one setting serves a sweep over proposers; on engine=llamacpp llama.cpp's own
    plain decoding, and its prompt lookup beside ngram), validated."""
    if value == "auto":
        peer = declaration_of(proposer).peer
        if engine == "llamacpp":
            return ["llama-cpp", *(["llama-cpp-lookup"] if peer == "hf-prompt-lookup" else [])]
        return [peer] if peer else []
    names = [] if value in (None, "", "none") else [value] if isinstance(value, str) else list(value)
    _llama_cpp_installed([n for n in names if n in LLAMA_CPP_PEERS])  # before any weights load
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        if unknown[0] in LOAD_PEERS:  # a known peer, of the other kind of bench
            raise SpecpipeError(f"peer={unknown[0]} is the peer of a request load: add requests=N (and "
                                "concurrency=C) to serve a load, or pick a per-prompt peer: "
                                f"{' or '.join(PEERS)}.")
        raise SpecpipeError(f"peer={unknown[0]} is not known: use {' or '.join(PEERS)}, a list "
                            "(peer=[hf-assisted,hf-prompt-lookup]), or auto (the proposer's counterpart); "
                            f"with requests=N, {' or '.join(LOAD_PEERS)}.")
    return names


def _llama_cpp_installed(names: list[str]) -> None:
    """The llama.cpp peers need llama-cpp-python: said before anything loads, in the peer's words."""
    if not names:
        return
    try:
        import llama_cpp  # noqa: F401 (importable, not only installed)
    except ImportError:
        from specpipe.engine.llamacpp import INSTALL

        raise SpecpipeError(f"peer={names[0]} runs llama.cpp through llama-cpp-python, which is not installed. "
                            f"Nothing was run: run `{INSTALL}` (a few minutes, once), or drop the peer "
                            f"(peer=none, or one of {', '.join(p for p in PEERS if p not in LLAMA_CPP_PEERS)}).") from None


def make_peers(names: list[str], pipeline, cfg) -> list[Peer]:
    return [_MAKERS[name](pipeline, cfg) for name in names]


def load_peer_names(value) -> list[str]:
    """`peer=` of a request load: none, hf-batched, or auto (hf-batched)."""
    names = [] if value in (None, "", "none") else ["hf-batched"] if value == "auto" else \
        [value] if isinstance(value, str) else list(value)
    unknown = [n for n in names if n not in LOAD_PEERS]
    if unknown:
        raise SpecpipeError(f"peer={unknown[0]} does not apply to a request load (requests=): use peer=hf-batched "
                            "(transformers' batched plain generate) or peer=auto; the per-prompt peers "
                            f"({', '.join(PEERS)}) run without requests=.")
    return names


def hf_batched(pipeline, concurrency: int) -> Callable[[list[list[int]], int], tuple[list[list[int]], float]]:
    """transformers' plain batched greedy `generate` over a request stream, `concurrency` requests
    per static batch: -> (new tokens per request, cut at EOS; wall seconds)."""
    model, device = hf_model(pipeline.runner), pipeline.runner.device
    eos = sorted(pipeline.eos_ids)
    pad = pipeline.target.tokenizer.pad_token_id
    pad = eos[0] if pad is None else pad

    @torch.inference_mode()
    def run(stream: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float]:
        outputs, start = [], time.perf_counter()
        for first in range(0, len(stream), concurrency):
            batch = stream[first : first + concurrency]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch]).to(device)  # left padding
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch]).to(device)
            out = model.generate(input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)
            outputs.extend(_until_eos(row[width:].tolist(), set(eos)) for row in out)
        return outputs, time.perf_counter() - start

    return run


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """A batch row's new tokens up to and including its first EOS (the rest is padding)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def hf_model(runner) -> torch.nn.Module:
    """The transformers model behind a runner, at the runner's precision: on the CPU in the same
    packed kernels (the native engine copied its weights from a dense model: quantize that one in
    place, once); on a GPU moved there in the precision's dtype, for transformers' own kernels
    (the CPU's packed linears keep their weights where they are)."""
    if runner.device.type != "cpu":
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(runner.precision)
        return runner.model.to(device=runner.device, dtype=dtype)
    return quantize_model(runner.model, runner.precision) if runner.engine == "native" else runner.model


def _hf_generate(pipeline, **options) -> Callable[..., list[int]]:
    model, sampling = hf_model(pipeline.runner), pipeline.sampling
    sample = {"do_sample": False} if sampling.greedy else {
        "do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or None,
        "top_p": sampling.top_p,
    }

    @torch.inference_mode()
    def generate(ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        torch.manual_seed(seed)
        input_ids = torch.tensor([ids]).to(model.device)
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                             eos_token_id=sorted(pipeline.eos_ids), **sample, **options)
        return out[0, len(ids):].tolist()

    return generate


def _assisted(pipeline, cfg) -> Peer:
    runner = getattr(pipeline.proposer, "runner", None)
    if runner is None:
        raise SpecpipeError(
            f"peer=hf-assisted needs a draft model, and proposer={proposer_kind(cfg)} has none. Use "
            "proposer=draft or proposer=twin with it, or peer=hf-prompt-lookup."
        )
    options = {"assistant_model": hf_model(runner)}
    draft_tokenizer = getattr(pipeline.proposer, "draft_tok", None)
    if draft_tokenizer is not None:  # another tokenizer: transformers' universal assisted generation
        options.update(tokenizer=pipeline.target.tokenizer, assistant_tokenizer=draft_tokenizer)
    return Peer("hf-assisted", _hf_generate(pipeline, **options))


def _static(pipeline, cfg) -> Peer:
    """transformers' static cache, sized once for every call as the runner's own cache is (a
    compiled forward then never recompiles for a longer prompt)."""
    capacity = getattr(getattr(pipeline.runner, "cache", None), "capacity", None)
    options = {"max_cache_len": capacity} if capacity else {}
    return Peer("hf-static", _hf_generate(pipeline, cache_implementation="static", **options))


def _prompt_lookup(pipeline, cfg) -> Peer:
    options = {"prompt_lookup_num_tokens": max(int(cfg.gamma), 1)}
    if "ngram_max" in cfg.proposer:
        options["max_matching_ngram_size"] = int(cfg.proposer.ngram_max)
    return Peer("hf-prompt-lookup", _hf_generate(pipeline, **options))


def _llama_cpp(plain: bool):
    def make(pipeline, cfg) -> Peer:
        name = "llama-cpp" if plain else "llama-cpp-lookup"
        return Peer(name, (llamacpp_peers.plain if plain else llamacpp_peers.lookup)(pipeline, cfg), timed=True)

    return make


_MAKERS = {"hf-plain": lambda pipeline, cfg: Peer("hf-plain", _hf_generate(pipeline)),
           "hf-static": _static,
           "hf-assisted": _assisted, "hf-prompt-lookup": _prompt_lookup, "llama-cpp": _llama_cpp(True),
           "llama-cpp-lookup": _llama_cpp(False)}
