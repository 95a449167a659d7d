"""`engine=native`: specpipe's own forward (native_model.py) behind the runner interface.

The runner drives a `NativeLM` over a preallocated `KVCache` of `rows` sequences. Each row's
length is a host int the runner keeps (it is told of every change), so a rollback is an
assignment, a tree's accepted path one gather per cache tensor, and nothing is read back from
the device. Logits and hidden states stay where the forward computed them. With `static`
(`graphs=on`; the default on CUDA) decode forwards run as the fixed shapes of static.py,
captured as CUDA graphs on a GPU; prefills, and blocks wider than its widest, run the eager
forward on the same cache.
"""

from __future__ import annotations

import torch

from specpipe.engine.base import Memory, Runner, Split, Tail, TargetOutput, joined, wide
from specpipe.engine.native_model import NativeLM
from specpipe.engine.static import StaticStep, bucket_of, spare_slots
from specpipe.errors import SpecpipeError
from specpipe.models.quantize import dense_weight, module_bytes

DEFAULT_CACHE_LEN = 2048  # tokens per sequence (prompt + output + one draft block), `cache_len=`


class NativeRunner(Runner):
    engine = "native"

    def __init__(self, model: torch.nn.Module, precision: str = "none", cache_len: int = DEFAULT_CACHE_LEN,
                 device: str = "cpu", rows: int = 1, compile: bool = False, static: bool = False,
                 exact: bool = True):
        """static: decode forwards in fixed shapes (static.py; CUDA graphs on a GPU); exact: its
        block policy (one padded shape for plain steps and verify blocks; False: the fewest rows)."""
        limit = getattr(model.config, "max_position_embeddings", cache_len) or cache_len
        self.lm = NativeLM(model, precision, min(cache_len, limit), device)
        if compile:
            from specpipe.engine.compile import CompiledStack

            self.lm.stack = CompiledStack(self.lm.stack)
            self.lm.fused = None  # asked for: torch.compile's stack runs instead of the C kernel's
        self.model = model  # the transformers model the weights came from (peers decode with it)
        self.precision = precision
        self.device = self.lm.device
        self.vocab_size, self.hidden_size, self.num_layers = self.lm.vocab_size, self.lm.hidden_size, self.lm.num_layers
        self.static = StaticStep(self.lm, exact) if static else None
        self.trees = not (static and exact)  # exact static blocks are chains (static.py)
        self.cache = None
        self._allocate(rows)
        self._block = 0  # tokens per row of the last forward (what `commit` keeps a part of)

    @property
    def step(self) -> str:
        """How decode forwards run: `eager`, or `static exact` / `static fast` (`+ CUDA graphs` on a GPU)."""
        if self.static is None:
            return "eager"
        return f"static {'exact' if self.static.exact else 'fast'}" + (" + CUDA graphs" if self.static.capture else "")

    @property
    def graphed(self) -> bool:
        return self.static is not None

    def _allocate(self, rows: int) -> None:
        """A cache of `rows` rows (a static step's: the bucket of `rows`, with spare slots)."""
        self.cache = None  # the old cache is freed before the new one is allocated
        if self.static is None:
            self.cache = self.lm.new_cache(rows, self.lm.max_len)
        else:
            rows = bucket_of(rows)
            self.cache = self.lm.new_cache(rows, self.lm.max_len, spare_slots(self.lm.max_len))
            self.static.bind(self.cache)
        self.lengths = [0] * rows
        self.expected = [0] * rows  # tokens each row's request may hold (`expect`; 0: not told)

    def plan(self, block: int) -> None:
        if self.static is not None:
            self.static.plan(block)

    @property
    def compile_s(self) -> float | None:
        """Wall time of the compiled stack's first call (compile or disk-cache load), if compiled."""
        return getattr(self.lm.stack, "compile_s", None)

    def reserve(self, rows: int) -> None:
        if rows > self.cache.batch:
            self._allocate(rows)

    def reset(self, row: int | None = None) -> None:
        if row is None:
            self.lengths = [0] * len(self.lengths)
            self.expected = [0] * len(self.expected)
        else:
            self.lengths[row] = self.expected[row] = 0

    def expect(self, row: int, tokens: int) -> None:
        self.expected[row] = tokens

    def prefill(self, row: int, ids: list[int], *, hidden: tuple[int, ...] = ()) -> TargetOutput:
        start = self.lengths[row]
        self._check_room(start + len(ids))
        tokens = torch.tensor([ids], dtype=torch.long).to(self.device, non_blocking=True)
        logits, states = self.lm.forward(tokens, [start], self.cache.row(row), None, hidden, last_only=True)
        self.lengths[row] = start + len(ids)
        return TargetOutput(logits, states)

    def forward(self, ids: torch.Tensor | Split, *, tree: torch.Tensor | None = None,
                hidden: tuple[int, ...] = (), tail: Tail | None = None) -> TargetOutput:
        batch, n = ids.shape
        starts = self.lengths[:batch]
        self._check_room(max(starts) + n)
        # the slots a static step attends over: what its rows' requests may hold, at least what they hold now
        needed = max(max(starts) + n, *self.expected[:batch])
        shape = None if self.static is None else self.static.shape(batch, n, tree, hidden, tail, needed)
        if shape is not None:
            out = self.static.forward(shape, ids, self.lengths, tree, tail)
        else:  # eager: the tail is the caller's
            cache = self.cache if batch == self.cache.batch else self.cache.rows(batch)
            out = TargetOutput(*self.lm.forward(joined(ids, self.device), starts, cache, tree, hidden))
        self.lengths[:batch] = [start + n for start in starts]
        self._block = n
        return out

    @torch.inference_mode()
    def commit(self, kept: list[int], paths: list[tuple[int, ...]] | None = None) -> None:
        for row, keep in enumerate(kept):
            start = self.lengths[row] - self._block  # the block's first slot
            path = paths[row] if paths else ()
            if path:  # a tree: the accepted nodes' entries sit at scattered rows of the block
                index = torch.tensor([start + r for r in path]).to(self.device, non_blocking=True)
                for tensor in self.cache.layers:  # [B, 2 kv heads, capacity, D]: keys and values
                    tensor[row, :, start + 1 : start + 1 + len(path)] = tensor[row, :, index]
            self.lengths[row] = start + keep

    def crop(self, row: int, length: int) -> None:
        self.lengths[row] = min(self.lengths[row], length)

    def _check_room(self, needed: int) -> None:
        if needed > self.cache.capacity:
            raise SpecpipeError(
                f"The sequence needs {needed} cache slots but the native engine's KV cache holds "
                f"{self.cache.capacity} (cache_len, at most the model's max_position_embeddings). Pass a larger "
                "cache_len=, a shorter prompt or fewer max_new_tokens."
            )

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden.to(self.device))

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return wide(self.lm.embed(ids.to(self.device)))

    def lm_head_weight(self) -> torch.Tensor:
        return dense_weight(self.lm.head)

    def memory(self) -> Memory:
        lm = self.lm
        weights = module_bytes(lm.head) + sum(module_bytes(m) for layer in lm.layers for m in layer.kernels())
        small = [lm.embedding, lm.norm, lm.cos, lm.sin] + [t for layer in lm.layers for t in vars(layer).values()
                                                            if isinstance(t, torch.Tensor)]
        weights += sum(t.numel() * t.element_size() for t in small)
        return Memory(weights, self.cache.bytes)
