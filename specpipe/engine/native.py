"""`engine=native`: specpipe's own forward (native_model.py) behind the runner interface.

The runner drives batch row 0 of a `NativeLM` and its preallocated `KVCache`: the cache length
is an integer, so `crop` is an assignment and `keep` (a tree's accepted path) is one gather per
cache tensor. Batched decoding drives the same model through `forward_batch` with a length per
row.
"""

from __future__ import annotations

import copy

import torch

from specpipe.engine.base import Memory, Runner, TargetOutput, tree_depths, wide
from specpipe.engine.native_model import NativeLM
from specpipe.errors import SpecpipeError
from specpipe.models.quantize import dense_weight, module_bytes

DEFAULT_CACHE_LEN = 2048  # tokens per sequence (prompt + output + one draft block), `cache_len=`


class NativeRunner(Runner):
    engine = "native"

    def __init__(self, model: torch.nn.Module, precision: str = "none", cache_len: int = DEFAULT_CACHE_LEN,
                 device: str = "cpu", batch: int = 1, compile: bool = False):
        limit = getattr(model.config, "max_position_embeddings", cache_len) or cache_len
        self.lm = NativeLM(model, precision, min(cache_len, limit), device)
        if compile:
            from specpipe.engine.compile import CompiledStack

            self.lm.stack = CompiledStack(self.lm.stack)
        self.model = model  # the transformers model the weights came from (peers decode with it)
        self.precision = precision
        self.vocab_size, self.hidden_size, self.num_layers = self.lm.vocab_size, self.lm.hidden_size, self.lm.num_layers
        self.cache = self.lm.new_cache(batch, self.lm.max_len)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.lm.device)  # [B] cached tokens per row
        self._length = 0  # row 0's, as a Python int (the single-sequence path never syncs a tensor)

    @property
    def length(self) -> int:
        return self._length

    @property
    def compile_s(self) -> float | None:
        """Wall time of the compiled stack's first call (compile or disk-cache load), if compiled."""
        return getattr(self.lm.stack, "compile_s", None)

    def reset(self) -> None:
        self._length = 0
        self.lengths.zero_()

    def forward(self, ids: list[int], *, last_only: bool = False, ancestry: torch.Tensor | None = None,
                hidden: tuple[int, ...] = ()) -> TargetOutput:
        n, start = len(ids), self._length
        self._check_room(start + n)
        device = self.lm.device
        offsets = torch.arange(n) if ancestry is None else tree_depths(ancestry)
        logits, states = self.lm.forward(torch.tensor([ids], device=device), torch.tensor([start], device=device),
                                         (start + offsets)[None].to(device), self.cache, ancestry, hidden, last_only,
                                         width=start + n)
        self._length = start + n
        self.lengths[0] = self._length
        return _on_cpu(TargetOutput(logits, states))

    def forward_batch(self, ids: torch.Tensor, *, last_only: bool = False, hidden: tuple[int, ...] = (),
                      ancestry: torch.Tensor | None = None) -> TargetOutput:
        """ids [k, n] appended to rows 0..k-1 (k <= B), each at that row's own length (rows may differ)."""
        start = self.lengths[: ids.shape[0]].clone()
        self._check_room(int(start.max()) + ids.shape[1])
        offsets = torch.arange(ids.shape[1]) if ancestry is None else tree_depths(ancestry)
        positions = start[:, None] + offsets.to(start.device)[None]
        cache = self.cache if ids.shape[0] == self.cache.batch else self.cache.rows(ids.shape[0])
        logits, states = self.lm.forward(ids.to(start.device), start, positions, cache, ancestry, hidden,
                                         last_only)
        self.lengths[: ids.shape[0]] += ids.shape[1]
        self._length = int(self.lengths[0])
        return _on_cpu(TargetOutput(logits, states))

    def batched(self, rows: int) -> "NativeRunner":
        """A runner over the same weights (shared, not copied) with its own cache of `rows`
        sequences: what a batch decodes on (specpipe/batch.py)."""
        other = copy.copy(self)
        other.cache = self.lm.new_cache(rows, self.lm.max_len)
        other.lengths = torch.zeros(rows, dtype=torch.long, device=self.lm.device)
        other._length = 0
        return other

    def forward_row(self, row: int, ids: list[int], *, last_only: bool = False,
                    hidden: tuple[int, ...] = ()) -> TargetOutput:
        """Append `ids` to batch row `row` alone (a request joining a running batch: its prefill).
        The row's cache is a view, so this is exactly the single-sequence forward."""
        n, start = len(ids), int(self.lengths[row])
        self._check_room(start + n)
        device = self.lm.device
        logits, states = self.lm.forward(torch.tensor([ids], device=device), torch.tensor([start], device=device),
                                         torch.arange(start, start + n, device=device)[None], self.cache.row(row),
                                         None, hidden, last_only, width=start + n)
        self.lengths[row] = start + n
        self._length = int(self.lengths[0])
        return _on_cpu(TargetOutput(logits, states))

    def crop_rows(self, lengths: torch.Tensor) -> None:
        """Row b keeps its first lengths[b] tokens (ragged rollback after a batched verdict);
        lengths [k] may cover the first k rows only."""
        k = lengths.shape[0]
        self.lengths[:k] = torch.minimum(self.lengths[:k], lengths.to(self.lengths.device))
        self._length = int(self.lengths[0])

    def reset_row(self, row: int) -> None:
        """Forget row `row`'s tokens (its request finished; the slot takes the next one)."""
        self.lengths[row] = 0
        self._length = int(self.lengths[0])

    @torch.inference_mode()
    def keep_row(self, row: int, start: int, slots: list[int]) -> None:
        """`keep` for batch row `row`."""
        if not slots:
            return
        index = torch.tensor(slots, device=self.lm.device)
        for tensor in self.cache.keys + self.cache.values:  # [B, kv heads, capacity, D]
            tensor[row, :, start : start + len(slots)] = tensor[row, :, index]

    def _check_room(self, needed: int) -> None:
        if needed > self.cache.capacity:
            raise SpecpipeError(
                f"The sequence needs {needed} cache slots but the native engine's KV cache holds "
                f"{self.cache.capacity} (cache_len, at most the model's max_position_embeddings). Pass a larger "
                "cache_len=, a shorter prompt or fewer max_new_tokens."
            )

    def keep(self, start: int, slots: list[int]) -> None:
        self.keep_row(0, start, slots)

    def crop(self, length: int) -> None:
        self._length = min(self._length, length)
        self.lengths[0] = self._length

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden.to(self.lm.device)).cpu()

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return wide(self.lm.embed(ids.to(self.lm.device))).cpu()

    def lm_head_weight(self) -> torch.Tensor:
        return dense_weight(self.lm.head)

    def memory(self) -> Memory:
        lm = self.lm
        weights = module_bytes(lm.head) + sum(module_bytes(m) for layer in lm.layers
                                              for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down))
        small = [lm.embedding, lm.norm, lm.cos, lm.sin] + [t for layer in lm.layers for t in (layer.norm1, layer.norm2)]
        weights += sum(t.numel() * t.element_size() for t in small)
        return Memory(weights, self.cache.bytes)


def _on_cpu(out: TargetOutput) -> TargetOutput:
    """Verifiers, proposers and their seeded generators work on the CPU: a CUDA forward's
    outputs come back (a [n, V] copy per step; no-op on the CPU)."""
    if out.logits.device.type == "cpu":
        return out
    return TargetOutput(out.logits.cpu(), {key: value.cpu() for key, value in out.hidden.items()})
