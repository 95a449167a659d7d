"""`engine=llamacpp`: a GGUF model evaluated by llama.cpp's ggml kernels, behind the runner interface.

The runner drives llama-cpp-python's low-level API (the `llamacpp` extra): it loads the GGUF
itself (its own quantization runs, nothing is dequantized), keeps one llama.cpp sequence per
row, evaluates a whole block in one `llama_decode` with logits for every position, and rolls a
row back by removing that sequence's cells past the kept prefix. Lengths are host ints, as in
the other runners; logits come back as a torch tensor on the CPU.

Kernels (`kernels=`): `exact` runs a q8_0 KV cache and keeps the file's weight layout, so ggml
takes the same kernel and summation order for one token and for a block (verify rows equal plain
rows, up to the block size `probe_exact` measures per CPU and file); `fast` is llama.cpp's
default (f16 cache, repacked weights), within tolerance. A draft model always runs `fast`: the target verifies it.

Hidden states: llama.cpp's per-token embeddings output (pooling none) is the final norm's
output, the LM head's input, so `FINAL` is offered (EAGLE and Medusa heads read it) and no other
layer. The heads also need the LM head and the token embeddings as torch weights: they are
dequantized from the GGUF on first use (`gguf` package), so a head sees what llama.cpp computes
with. Trees are not evaluated: llama.cpp masks attention by sequence id, and a tree's accepted
path would have to be moved between sequences; proposers that draft trees draft their best
path instead (`trees = False`), as they do for a batch.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from specpipe.engine.base import FINAL, KERNELS, Memory, Runner, Split, Tail, TargetOutput, joined
from specpipe.errors import Refusal, SpecpipeError, refuse

CELLS = 256  # llama.cpp pads a context to whole blocks of this many cells
PROBE_TOKENS = 64  # the largest evaluation probe_exact measures (a batch's rows × tokens a row count)
PINNED = "0.3.36"  # the llama-cpp-python release the runner is written and tested against
INSTALL = "specpipe install llamacpp"  # builds llama-cpp-python with flags that work on this CPU


def twin_refusal(gguf: str | None) -> Refusal | None:
    """proposer=twin here: a lower-bit GGUF of the target, which the user must give (llama.cpp runs
    files as they are: there is no copy of the target to quantize on the fly)."""
    if gguf:
        return None
    return Refusal("proposer=twin on engine=llamacpp drafts with a lower-bit GGUF of the target, and none was given",
                   "pass proposer.gguf=FILE.gguf (e.g. a Q2_K copy made with llama.cpp's quantize tool), or use "
                   "proposer=ngram or suffix")


def hidden_refusal(reads_layers: bool, proposer: str = "this proposer") -> Refusal | None:
    """A proposer that reads hidden states of several target layers (EAGLE-3, DFlash) here:
    llama.cpp hands over one hidden state, the final norm's output (its embeddings output)."""
    if not reads_layers:
        return None
    return Refusal(f"{proposer} reads hidden states of several target layers, and llama.cpp hands over only the "
                   "final norm's output", "use proposer=eagle, medusa, ngram, suffix or draft, or engine=native")


def tree_refusal() -> Refusal:
    """A tree draft given to this runner (proposers draft their best path here: `trees = False`)."""
    return Refusal("engine=llamacpp evaluates chains, not tree drafts: llama.cpp masks attention by sequence id, and "
                   "a tree's accepted path would have to move between sequences",
                   "drop proposer.tree, or use engine=native")


def library():
    """llama-cpp-python's low-level module, or a SpecpipeError that says how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise SpecpipeError(
            f"engine=llamacpp needs llama-cpp-python, which is not installed. Run `{INSTALL}` (it builds "
            f"llama-cpp-python {PINNED} from source with CPU flags that work on this machine, a few minutes), or "
            "use engine=auto."
        ) from None
    from llama_cpp import _logger

    _logger.set_verbose(False)  # llama.cpp's load and context logs stay off unless it errs
    return llama_cpp


def threads() -> int:
    """The cores this process may run on (llama.cpp's fastest setting for decode on small CPUs)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class LlamaCppRunner(Runner):
    engine = "llamacpp"
    precision = "gguf"  # the file's own quantization (Q4_1, Q4_K_M, ...)
    device = torch.device("cpu")
    trees = False  # proposers draft chains here (a tree's best path)

    def __init__(self, gguf: str | Path, *, cache_len: int = 2048, rows: int = 1, n_threads: int | None = None,
                 kernels: str = "exact"):
        if kernels not in KERNELS:
            raise SpecpipeError(f"kernels={kernels!r} is not a kernel choice. Use one of: {', '.join(KERNELS)}.")
        self.lib = library()
        self.path = Path(gguf)
        self.threads = n_threads or threads()
        self.kernels = kernels
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0  # the CPU build: ggml's CPU kernels
        # repacked weights (Q4_0, Q4_K, ... in interleaved rows) take a GEMV kernel for one token and a
        # GEMM for several, which sum in another order: exact keeps the file's layout, one kernel for both
        params.use_extra_bufts = kernels == "fast"
        self.handle = self.lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.handle:
            raise SpecpipeError(f"llama.cpp could not load {self.path}: it is not a GGUF file llama-cpp-python "
                                f"{PINNED} reads (another architecture or a newer format). Use engine=auto.")
        self.vocab = self.lib.llama_model_get_vocab(self.handle)
        self.vocab_size = self.lib.llama_vocab_n_tokens(self.vocab)
        self.hidden_size = self.lib.llama_model_n_embd(self.handle)
        self.num_layers = self.lib.llama_model_n_layer(self.handle)
        self.positions = self.lib.llama_model_n_ctx_train(self.handle)  # the model's own context length
        self.capacity = min(cache_len, self.positions) if self.positions > 0 else cache_len
        self.ctx = None
        self._embeddings = False  # whether llama.cpp extracts the final norm's output (set per call)
        self._make_context(rows)
        self._block = 0

    # ---- the context: one llama.cpp sequence per row --------------------------------------------

    def _make_context(self, rows: int) -> None:
        if self.ctx:
            self.lib.llama_free(self.ctx)
        params = self.lib.llama_context_default_params()
        per_row = -(-self.capacity // CELLS) * CELLS  # llama.cpp sizes a sequence's stream in whole blocks
        params.n_ctx = per_row * rows
        params.n_seq_max = rows
        # a KV stream per row: in one unified cache a row's new cells fill the holes other rows'
        # rollbacks left, and attention sums a row's cells in cell order, so rows decoded together
        # differed from each row alone (measured: ~40% of logit rows, one-token and block rows alike).
        # One row keeps the unified cache: no other row leaves holes, and its step was ~5% faster
        params.kv_unified = rows == 1
        params.n_batch = params.n_ubatch = min(self.capacity, 512)  # prompts go in chunks of this
        params.n_threads = params.n_threads_batch = self.threads
        params.embeddings = False
        # flash attention (llama.cpp's own default on the CPU) reduces each query row alone (without it a
        # block's rows differ from one-token rows); with an f16 or f32 cache, one token over ≥ 512 cells
        # splits the cells across threads and sums the parts in another order, a q8_0 cache never does
        params.flash_attn_type = self.lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if self.kernels == "exact":
            params.type_k = params.type_v = self.lib.GGML_TYPE_Q8_0
        params.no_perf = True
        self.ctx = self.lib.llama_init_from_model(self.handle, params)
        if self.ctx and self.lib.llama_n_ctx(self.ctx) < self.capacity * rows:  # rounded below what a row needs
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if not self.ctx:
            raise SpecpipeError(f"llama.cpp could not allocate a context of {params.n_ctx} tokens for {self.path}. "
                                "Lower cache_len= or the number of rows (batch=, concurrency=).")
        self.memory_handle = self.lib.llama_get_memory(self.ctx)
        self.chunk = params.n_batch
        self.batch = self.lib.llama_batch_init(self.chunk, 0, 1)
        self.lengths = [0] * rows
        self._embeddings = False

    def __del__(self):  # the context and batch before the model they point into
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        if getattr(self, "ctx", None):
            lib.llama_batch_free(self.batch)
            lib.llama_free(self.ctx)
        if getattr(self, "handle", None):
            lib.llama_model_free(self.handle)

    def reserve(self, rows: int) -> None:
        if rows > len(self.lengths):
            self.lib.llama_batch_free(self.batch)
            self._make_context(rows)

    def reset(self, row: int | None = None) -> None:
        if row is None:
            self.lib.llama_memory_clear(self.memory_handle, True)
            self.lengths = [0] * len(self.lengths)
        else:
            self.crop(row, 0)

    # ---- evaluation -----------------------------------------------------------------------------

    def _decode(self, entries: list[tuple[int, int, int]], outputs: bool, hidden: tuple[int, ...]) -> None:
        """entries: (token, row, position) in block order, at most `chunk`; outputs: logits (and
        embeddings) for every entry, else for the last only."""
        want = bool(hidden)
        if want != self._embeddings:
            self.lib.llama_set_embeddings(self.ctx, want)
            self._embeddings = want
        batch = self.batch
        for i, (token, row, position) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0] = row
            batch.logits[i] = outputs or i == len(entries) - 1
        batch.n_tokens = len(entries)
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise SpecpipeError(f"llama.cpp could not evaluate a block of {len(entries)} tokens (llama_decode "
                                f"returned {status}: the context is full). Lower max_new_tokens or the prompt length, "
                                "or raise cache_len=.")

    def _outputs(self, count: int, hidden: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The last decode's `count` output rows: logits [count, V], hidden {FINAL: [count, H]}."""
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(count, self.vocab_size))
        states = {}
        for key in hidden:
            if key != FINAL:
                refuse(hidden_refusal(True))
            pointer = self.lib.llama_get_embeddings(self.ctx)
            states[key] = torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(count, self.hidden_size)).copy())
        return torch.from_numpy(logits.copy()), states

    def prefill(self, row: int, ids: list[int], *, hidden: tuple[int, ...] = ()) -> TargetOutput:
        start = self.lengths[row]
        self._check_room(start + len(ids))
        parts: dict[int, list[torch.Tensor]] = {key: [] for key in hidden}
        for first in range(0, len(ids), self.chunk):
            piece = ids[first : first + self.chunk]
            self._decode([(t, row, start + first + i) for i, t in enumerate(piece)], bool(hidden), hidden)
            logits, states = self._outputs(len(piece) if hidden else 1, hidden)
            for key, value in states.items():
                parts[key].append(value)
        self.lengths[row] = start + len(ids)
        return TargetOutput(logits[-1:][None], {key: torch.cat(value)[None] for key, value in parts.items()})

    def forward(self, ids: torch.Tensor | Split, *, tree: tuple[int, ...] | None = None,
                hidden: tuple[int, ...] = (), tail: Tail | None = None) -> TargetOutput:
        if tree is not None:
            refuse(tree_refusal())
        batch, n = ids.shape
        if batch * n > self.chunk:
            raise SpecpipeError(f"engine=llamacpp evaluates at most {self.chunk} tokens a step; this step has "
                                f"{batch} rows of {n}. Lower gamma or the number of rows.")
        starts = self.lengths[:batch]
        self._check_room(max(starts) + n)
        tokens = joined(ids, "cpu").tolist()  # the CPU engine: no device to sync
        self._decode([(tokens[b][i], b, starts[b] + i) for b in range(batch) for i in range(n)], True, hidden)
        logits, states = self._outputs(batch * n, hidden)
        self.lengths[:batch] = [start + n for start in starts]
        self._block = n
        return TargetOutput(logits.view(batch, n, -1), {key: value.view(batch, n, -1) for key, value in states.items()})

    def commit(self, kept: list[int], paths: list[tuple[int, ...]] | None = None) -> None:
        if paths and any(paths):
            refuse(tree_refusal())
        for row, keep in enumerate(kept):
            self.crop(row, self.lengths[row] - self._block + keep)

    def crop(self, row: int, length: int) -> None:
        if length < self.lengths[row]:
            self.lib.llama_memory_seq_rm(self.memory_handle, row, length, -1)  # cells at positions ≥ length
            self.lengths[row] = length

    def _check_room(self, needed: int) -> None:
        if needed > self.capacity:
            raise SpecpipeError(
                f"The sequence needs {needed} cache slots but the llama.cpp context holds {self.capacity} per row "
                "(cache_len, at most the model's trained context). Pass a larger cache_len=, a shorter prompt or "
                "fewer max_new_tokens."
            )

    # ---- what heads read: the model's embeddings and LM head as torch weights ---------------------

    @cached_property
    def _weights(self) -> dict[str, torch.Tensor]:
        """token_embd and output (tied models: token_embd) dequantized from the GGUF, float32."""
        import gguf

        wanted = {"token_embd.weight", "output.weight"}
        found = {t.name: t for t in gguf.GGUFReader(self.path).tensors if t.name in wanted}
        dense = {name: torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type)))
                 .reshape(-1, self.hidden_size).float() for name, t in found.items()}  # [V, H]
        return {"embed": dense["token_embd.weight"], "head": dense.get("output.weight", dense["token_embd.weight"])}

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float() @ self._weights["head"].T

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._weights["embed"][ids]

    def lm_head_weight(self) -> torch.Tensor:
        return self._weights["head"]

    def stop_ids(self) -> set[int]:
        """End-of-generation tokens by the GGUF's own vocabulary (EOS and end of turn)."""
        ids = {self.lib.llama_vocab_eos(self.vocab), self.lib.llama_vocab_eot(self.vocab)}
        return {i for i in ids if i >= 0}

    def memory(self) -> Memory:
        return Memory(self.lib.llama_model_size(self.handle), self.lib.llama_state_get_size(self.ctx))


def load_gguf_runner(source, *, cache_len: int, rows: int = 1, kernels: str = "exact") -> LlamaCppRunner:
    """A llama.cpp runner for a resolved model source, or a SpecpipeError if it has no GGUF file."""
    if source.gguf is None:
        raise SpecpipeError(f"engine=llamacpp runs GGUF files, and model '{source.name}' is a directory or hub id. "
                            "Pass a zoo name or a .gguf file, or use engine=auto.")
    return LlamaCppRunner(Path(source.path) / source.gguf, cache_len=cache_len, rows=rows, kernels=kernels)


def probe_exact(runner: LlamaCppRunner, largest: int = PROBE_TOKENS) -> int:
    """The largest block size n ≤ `largest` such that every block of 2..n tokens has rows bitwise
    equal to one-token evaluations on this machine (1: none), after a short context and after one
    of 600 tokens (past 512 cached cells ggml may split a one-token attention across threads).
    ggml picks kernels by CPU (AMX, AVX-512, AVX2), file types and block size (Q4_K files switch
    kernels at 8 tokens here), so this is measured, not assumed. Uses (and then forgets) row 0.
    A batch's evaluation is one block of every row's tokens for the matmuls (attention is each
    row's own, in its own KV stream), so it is exact where rows × tokens a row is within n."""
    exact_up_to = largest
    for context in (4, 600):
        if context + largest > runner.capacity:
            continue
        ids = [(7 + 13 * i) % runner.vocab_size for i in range(context + largest)]  # any tokens: only sums matter
        runner.reset(0)
        runner.prefill(0, ids[:context])
        singles = []
        for token in ids[context:]:
            singles.append(runner.forward(torch.tensor([[token]])).logits[0, 0])
            runner.commit([1])
        for size in range(2, exact_up_to + 1):
            runner.crop(0, context)
            rows = runner.forward(torch.tensor([ids[context : context + size]])).logits[0]
            runner.commit([size])
            if not all(torch.equal(a, b) for a, b in zip(rows, singles)):
                exact_up_to = size - 1
                break
    runner.reset(0)
    return exact_up_to
