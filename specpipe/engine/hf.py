"""`engine=hf`: any transformers causal LM, eager, on a `DynamicCache`.

The fallback for architectures the native engine does not cover (and the reference the native
engine is tested against). Its precision is set by swapping the model's Linear layers in place
(specpipe/models/quantize.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specpipe.drafts import block_ancestry, block_depths
from specpipe.engine.base import FINAL, Memory, Runner, Split, Tail, TargetOutput, joined, wide
from specpipe.errors import SpecpipeError
from specpipe.heads.logits import final_softcap, softcap
from specpipe.models.quantize import dense_weight, module_bytes, quantize_model


class HFRunner(Runner):
    """A single sequence (`max_rows` 1): transformers' cache has no per-row lengths."""

    engine = "hf"
    max_rows = 1
    device = torch.device("cpu")

    def __init__(self, model: torch.nn.Module, precision: str = "none"):
        self.model = quantize_model(model, precision)
        self.precision = precision
        config = model.config
        self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.cache = DynamicCache(config=config)
        self._block = 0

    @property
    def lengths(self) -> list[int]:
        return [self.cache.get_seq_length()]

    def reserve(self, rows: int) -> None:
        if rows > 1:
            raise SpecpipeError("engine=hf decodes one sequence at a time; use engine=native for a batch.")

    def reset(self, row: int | None = None) -> None:
        self.cache = DynamicCache(config=self.model.config)

    def prefill(self, row: int, ids: list[int], *, hidden: tuple[int, ...] = ()) -> TargetOutput:
        return self._forward(ids, None, hidden, last_only=True)

    def forward(self, ids: torch.Tensor | Split, *, tree: torch.Tensor | None = None,
                hidden: tuple[int, ...] = (), tail: Tail | None = None) -> TargetOutput:
        self._block = ids.shape[1]
        return self._forward(joined(ids, "cpu")[0].tolist(), tree, hidden)  # the hf engine runs on the CPU: no sync

    @torch.inference_mode()
    def _forward(self, ids: list[int], tree: torch.Tensor | None, hidden: tuple[int, ...],
                 last_only: bool = False) -> TargetOutput:
        input_ids = torch.tensor([ids], dtype=torch.long)
        masks = {} if tree is None else self._tree_inputs(tree)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0, output_hidden_states=bool(hidden), **masks)
        return TargetOutput(wide(out.logits), {key: self._hidden(out.hidden_states, key) for key in hidden})

    def _hidden(self, states: tuple[torch.Tensor, ...], key: int) -> torch.Tensor:
        # transformers' hidden_states: [embeddings, layer 0, ..., layer L-2, final norm(layer L-1)]
        if key == FINAL:
            return wide(states[-1])
        if not 0 <= key < self.num_layers - 1:
            raise SpecpipeError(f"engine=hf exposes the outputs of layers 0..{self.num_layers - 2} and the final "
                                f"norm, not layer {key}; use engine=native or another layer.")
        return wide(states[key + 1])

    def _tree_inputs(self, parents: torch.Tensor) -> dict:
        """A tree's mask and positions from its parents [1, N] (on the CPU, as this engine is)."""
        ancestry = block_ancestry(parents)[0]  # [N + 1, N + 1]
        past, n = self.length, ancestry.shape[0]
        allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), ancestry], 1)  # [n, past + n]
        dtype = next(p.dtype for p in self.model.parameters() if p.is_floating_point())
        mask = torch.zeros(1, 1, n, past + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return {"attention_mask": mask, "position_ids": past + block_depths(parents)}

    @torch.inference_mode()
    def commit(self, kept: list[int], paths: list[tuple[int, ...]] | None = None) -> None:
        start = self.cache.get_seq_length() - self._block
        path = paths[0] if paths else ()
        if path:  # the accepted nodes' entries sit at scattered rows of the block
            index = torch.tensor([start + r for r in path])
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    tensor = getattr(layer, name)  # [batch, kv heads, length, head dim]
                    tensor[:, :, start + 1 : start + 1 + len(path)] = tensor[:, :, index]
        self.crop(0, start + kept[0])

    def crop(self, row: int, length: int) -> None:
        drop = self.cache.get_seq_length() - length
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5 takes the number of tokens to drop, negated

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        dtype = weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() else torch.float32
        return softcap(wide(head(hidden.to(dtype))), final_softcap(self.model.config))  # the model's own logits

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return wide(self.model.get_input_embeddings()(ids))

    def lm_head_weight(self) -> torch.Tensor:
        return dense_weight(self.model.get_output_embeddings())

    def memory(self) -> Memory:
        cache = sum(t.numel() * t.element_size() for layer in self.cache.layers
                    for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None)
        return Memory(module_bytes(self.model), cache)
