"""The runner interface: one causal LM and its KV cache, advanced a block of tokens at a time.

Three implementations sit behind it (`engine=native`: specpipe's own forward for the Llama and
Qwen2 families; `engine=hf`: any transformers architecture; `engine=llamacpp`: a GGUF file on
llama.cpp's CPU kernels); nothing above it knows which one runs. A runner knows nothing about drafts or verdicts: callers feed token ids and get a
`TargetOutput` back, crop the cache to a prefix (the rollback after a rejected draft) and move
a tree's accepted path into place (`keep`).

Hidden-state keys (what a proposer may declare in `hidden_layers`): `i` in 0..L-1 is the
residual stream after decoder layer i; `FINAL` (-1) is the final norm's output, the LM head's
input (what Medusa and EAGLE heads read).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

FINAL = -1  # hidden-state key of the LM head's input
# `kernels=`, one meaning whatever the engine: exact (a verify block's rows bitwise equal plain
# steps' rows) | fast (the fastest, within tolerance). How: engine/static.py, engine/llamacpp.py
KERNELS = ("exact", "fast")


@dataclass(frozen=True)
class Tail:
    """A computation on a forward's outputs that a static runner runs inside the step's own
    graph, so on a GPU it launches nothing of its own and only its small output leaves the
    graph (vLLM's model runner samples and verifies the same way). `compute(logits [R, K, V],
    ids [R, K], counts [R]) -> [R, C]`, a tensor function of its inputs alone (no host reads,
    no shape that depends on a value), over the step's padded block: R >= B rows and K >= n
    columns, of which only the first B rows are read. `counts`: one integer per row, host ints
    or a device tensor [B]. `name` keys the graphs: one name, one computation (and one layout
    of `inputs`). `inputs`: what else the computation reads, made only by a runner that runs it."""

    name: str
    compute: Callable[..., torch.Tensor]  # (logits, ids, counts, *inputs) -> [R, C]
    counts: list[int] | torch.Tensor
    inputs: "TailInputs | None" = None


@dataclass(frozen=True)
class TailInputs:
    """Float32 tensors a `Tail` reads after (logits, ids, counts): a sampling verifier's draws,
    a draft's probabilities. A static runner keeps one buffer [R, *size] per input for each of
    its shapes, and before the replay `fill` writes the step's rows into them in place (a draw
    straight into its buffer: no copy); what it leaves keeps old values, which the computation
    masks by the counts. Only a runner that runs the tail calls `fill`, so an eager step draws
    nothing twice."""

    fill: Callable[[list[torch.Tensor]], None]  # the buffers [R, *size] each, rows 0..B-1 written
    sizes: Callable[[int, int], tuple[tuple[int, ...], ...]]  # (block K, vocab) -> each buffer's size a row


@dataclass(frozen=True)
class Split:
    """A block of ids whose first columns the host made and the rest the device (a row's last
    token, then a head's or a draft model's draft): `torch.cat([host, device], 1)`, which a
    static step never builds (the host's part rides with its other inputs, the device's is
    copied in after it), saving the host's copy and the concatenation."""

    host: torch.Tensor  # [B, a] on the host
    device: torch.Tensor  # [B, b] on the runner's device

    @property
    def shape(self) -> tuple[int, int]:
        return self.host.shape[0], self.host.shape[1] + self.device.shape[1]


def joined(ids: "torch.Tensor | Split", device: torch.device | str) -> torch.Tensor:
    """A forward's ids [B, n] as one tensor on `device`."""
    if isinstance(ids, Split):
        return torch.cat([ids.host.to(device, non_blocking=True), ids.device.to(device)], 1)
    return ids.to(device, non_blocking=True)


@dataclass(frozen=True)
class TargetOutput:
    """What one forward computed. logits: [B, n, V] float32 (n = 1 for a `last_only` forward),
    or None where the forward's `Tail` ran inside its graph (then nothing else reads them);
    hidden: {layer key: [B, n_block, H] float32}, every row of the block, for the keys asked
    (float64 models give float64); tail: the `Tail`'s output [B, C] where the runner ran it
    (None: the caller computes from the logits instead)."""

    logits: torch.Tensor | None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    tail: torch.Tensor | None = None

    def row(self, b: int) -> "TargetOutput":
        """Batch row b alone, as a single-sequence forward returns it ([1, n, ...])."""
        return TargetOutput(None if self.logits is None else self.logits[b : b + 1],
                            {key: value[b : b + 1] for key, value in self.hidden.items()},
                            None if self.tail is None else self.tail[b : b + 1])


@dataclass(frozen=True)
class Memory:
    """Bytes a runner holds: its weights and its KV cache (allocated, not just used)."""

    weights: int
    cache: int


class Runner(ABC):
    """One model and a KV cache of `rows` sequences, batch-first: a forward appends a block of
    tokens to each of rows 0..B-1 at that row's own length; `commit` then keeps, per row, the
    part of the block a verdict accepted (a length, or a tree's path moved into place). Lengths
    are host ints the runner keeps itself (it is told every change), so it never reads one back
    from the device; inputs and outputs stay on the runner's `device`."""

    engine: str  # "native", "hf" or "llamacpp"
    precision: str  # a mode of specpipe/models/quantize.py
    vocab_size: int
    hidden_size: int
    num_layers: int
    device: torch.device
    max_rows: int | None = None  # the most rows its cache can hold (None: as many as memory allows)
    trees: bool = True  # whether `forward` takes a tree block (False: proposers draft chains)
    step: str = "eager"  # how decode forwards run (engine=native: `static exact` etc., engine/static.py)
    graphed: bool = False  # decode forwards in fixed shapes, CUDA graphs on a GPU: heads graph their drafts too
    lengths: list[int]  # [rows] tokens cached per row (host)

    @property
    def length(self) -> int:
        """Row 0's cached tokens (a single sequence's)."""
        return self.lengths[0]

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @abstractmethod
    def reserve(self, rows: int) -> None:
        """A cache of at least `rows` sequences (grown between runs: growing forgets every row)."""

    def plan(self, block: int) -> None:
        """Forwards of up to `block` tokens a row will come (1 + the widest draft of a pipeline's
        controller and proposer): a static step pads its blocks to sizes fixed from it. Planned
        blocks only widen. Default: nothing to plan."""

    @abstractmethod
    def reset(self, row: int | None = None) -> None:
        """Forget row `row`'s cached tokens (None: every row's), and what it was told to expect."""

    def expect(self, row: int, tokens: int) -> None:
        """Row `row`'s request may hold up to `tokens` tokens (its prompt and budget), told after
        the row's reset: a static step attends over a width that holds them from the request's
        first step to its last (engine/static.py). Default: nothing to do."""

    @abstractmethod
    def prefill(self, row: int, ids: list[int], *, hidden: tuple[int, ...] = ()) -> TargetOutput:
        """Append `ids` to row `row` alone (a request's prompt); logits [1, 1, V] of its last
        position, hidden {key: [1, n, H]} of every position."""

    @abstractmethod
    def forward(self, ids: "torch.Tensor | Split", *, tree: torch.Tensor | None = None,
                hidden: tuple[int, ...] = (), tail: Tail | None = None) -> TargetOutput:
        """ids [B, n] (on the device, or on the host where the host made them: a static step
        then sends them with its other inputs, in one copy; or a `Split` of both), appended to
        rows 0..B-1 -> logits [B, n, V], on the device.

        tree: a tree block's parents [B, n - 1] int64, where the draft is (specpipe/drafts.py):
        block row i+1 of row b is node i, it sees row 0, its ancestors and itself, at position
        length + its depth, so every row is computed as in a sequential forward along its own
        path; a padding node sees row 0 and itself. Its mask and positions are built from the
        tensor where it is, never read back from a GPU. tail: run inside the forward's graph where the
        runner has one (static steps: `TargetOutput.tail`); others ignore it and return logits."""

    @abstractmethod
    def commit(self, kept: list[int], paths: list[tuple[int, ...]] | None = None) -> None:
        """After a forward of n tokens per row: row b keeps the first kept[b] block rows, or with
        paths[b] (a tree) block row 0 and then the rows of paths[b], moved into place."""

    @abstractmethod
    def crop(self, row: int, length: int) -> None:
        """Row `row` keeps its first `length` cached tokens (a draft cache's rollback)."""

    @abstractmethod
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's LM head over features [..., H] -> float32 logits [..., V]."""

    @abstractmethod
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [...] -> float32 [..., H] (what an EAGLE head reads with features)."""

    @abstractmethod
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight [V, H] as float32 (a head's draft vocabulary rows come from it)."""

    @abstractmethod
    def memory(self) -> Memory:
        """Weight and KV cache bytes."""

    def stop_ids(self) -> set[int]:
        """End-of-generation ids the model itself declares, beyond its tokenizer's EOS (an instruct
        model's generation config lists end of turn too)."""
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return {i for i in (config_eos if isinstance(config_eos, list) else [config_eos]) if i is not None}


def wide(t: torch.Tensor) -> torch.Tensor:
    """float32, or float64 where it already is (tests demand exact equality on float64 models)."""
    return t if t.dtype == torch.float64 else t.float()


OVERLAP = ("auto", "on", "off")  # `overlap=`: plain steps queued before the last is read (auto: on CUDA)


def overlaps(overlap: str, device: torch.device) -> bool:
    """Whether plain steps overlap the host with the device (auto: where the device runs
    asynchronously, so the host's work between steps can hide behind the next step's kernels)."""
    return overlap == "on" or (overlap == "auto" and torch.device(device).type == "cuda")
