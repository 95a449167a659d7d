"""`proposer=medusa`: K heads on the target's last hidden state guess the next K tokens at once.

No second model and no draft forward passes: after each verdict the feature of the token that
produced the next token (the target's LM-head input, which the verify forward hands over)
feeds every head once. The first step of a generation has no feature yet and drafts
nothing. With sampling the heads' distributions go to the verifier as draft_probs, so the
rejection verifier stays lossless; `verifier=typical` is Medusa's own (lossy) acceptance.

Where the target's steps are graphed (`Runner.graphed`: CUDA graphs on a GPU) the heads run as
one graph too: every head over every row's feature buffer, the rows not drafting and the heads
past γ computed and dropped (a few rows more cost a GPU nothing; a launch each, a lot).
"""

from __future__ import annotations

import torch

from specpipe.declaration import Declaration
from specpipe.drafts import DraftBatch
from specpipe.engine import FINAL, Runner, TargetOutput
from specpipe.engine.graphs import Graphs
from specpipe.errors import SpecpipeError
from specpipe.heads.io import load_medusa
from specpipe.heads.medusa import MedusaHeads
from specpipe.models.quantize import module_bytes
from specpipe.proposers.base import Proposer
from specpipe.sampling import DRAFT, SamplingParams, race
from specpipe.types import Rows
from specpipe.types import RowVerdict, Verdict


class MedusaProposer(Proposer):
    hidden_layers = (FINAL,)

    def __init__(self, heads: MedusaHeads, sampling: SamplingParams, tree: list[list[int]] | None = None):
        self.heads = heads
        self.sampling = sampling
        self.tree = None if tree is None else check_tree(tree, heads.num_heads)
        self.target: Runner | None = None
        self.graphs: Graphs | None = None  # the heads' graph, where the target's steps are graphed
        self.features: torch.Tensor | None = None  # [rows, H] each row's feature of its last committed token's predecessor
        self.ready: list[bool] = []  # [rows] whether that feature is there yet (not before a row's first step)
        self._sizes: dict[tuple[int, ...], torch.Tensor] = {}  # draft lengths on the device, read only
        self._shapes: dict[int, tuple] = {}  # by γ: the tree's paths no deeper, as device index tensors

    def widest(self, gamma: int, trees: bool) -> int:
        return max(gamma, len(self.tree)) if self.tree is not None and trees else gamma

    def bind(self, target: Runner) -> None:
        self.target = target
        if target.device.type != "cpu":
            self.heads = self.heads.to(target.device)
        self.graphs = Graphs(target.device) if getattr(target, "graphed", False) else None
        self._sizes.clear()  # on the old target's device
        self._shapes.clear()

    def reserve(self, rows: int) -> None:
        if len(self.ready) < rows:
            self.ready = [False] * rows
            self.features = None

    def prefill(self, row: int, prompt: list[int], out: TargetOutput | None) -> None:
        self.ready[row] = False

    @torch.inference_mode()
    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        ready = [b for b, gamma in enumerate(gammas) if gamma > 0 and self.ready[b]]
        if not ready:
            return DraftBatch.empty(len(gammas), rows.device)
        heads = min(max(gammas[b] for b in ready), self.heads.num_heads)
        if self.graphs is not None and self.sampling.greedy and not (self.tree is not None and rows.trees) \
                and ready == list(range(len(gammas))):
            return self._picked(heads, gammas)
        index = torch.tensor(ready).to(rows.device, non_blocking=True)
        if self.graphs is None:
            logits = self.heads(self.features[index], self.target.lm_head, heads=heads)  # [K, m, V]
        else:  # [K, rows, V] every head and row, from the graph's memory: the index copies out what drafts
            logits = self.graphs.run(len(self.features), self._every_head)[:heads, index]
        if self.tree is not None and rows.trees:
            return self._trees(logits, ready, gammas)
        return self._chains(logits.transpose(0, 1), ready, gammas, rows)

    def _every_head(self) -> torch.Tensor:
        """Every head over every row's feature (the graphed computation): [K, rows, V]."""
        return self.heads(self.features, self.target.lm_head)

    def _every_pick(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's greedy pick for every row (the graphed computation): tokens and their
        probabilities, [rows, K] each, `_chains`' softmax and maximum."""
        top, picked = torch.softmax(self._every_head(), -1).max(-1)  # [K, rows]
        return picked.T.contiguous(), top.float().T.contiguous()

    def _picked(self, heads: int, gammas: list[int]) -> DraftBatch:
        """Every row drafts, greedily: its chain is the picks' graph's first `heads` columns, as
        they are (views of the graph's memory, which its next replay, after this step's verdict,
        rewrites): no launch beyond the graph's."""
        tokens, confidence = self.graphs.run(("medusa pick", len(self.features)), self._every_pick)
        count = len(gammas)
        sizes = tuple(min(gamma, heads) for gamma in gammas)
        return DraftBatch(tokens[:count, :heads], self._lengths(sizes), tuple(gammas), None,
                          confidence[:count, :heads], counts=sizes)

    def _lengths(self, sizes: tuple[int, ...]) -> torch.Tensor:
        """The draft lengths [B] on the device: copied once for each set of lengths."""
        if sizes not in self._sizes:
            if len(self._sizes) >= 64:  # a batch's ragged lengths: a few dozen sets at most, as a rule
                self._sizes.clear()
            self._sizes[sizes] = torch.tensor(sizes).to(self.target.device)
        return self._sizes[sizes]

    def _chains(self, logits: torch.Tensor, ready: list[int], gammas: list[int], rows: Rows) -> DraftBatch:
        """The heads' logits [m, K, V] of the ready rows -> their chains: argmax, or sampled with
        the target's transform (head i from the row's draft stream i); other rows draft nothing."""
        count, heads, vocab = len(gammas), logits.shape[1], logits.shape[2]
        tokens = torch.zeros(count, heads, dtype=torch.long, device=rows.device)
        confidence = torch.zeros(count, heads, device=rows.device)
        probs = None
        index = torch.tensor(ready).to(rows.device, non_blocking=True)
        if self.sampling.greedy:
            top, picked = torch.softmax(logits, -1).max(-1)  # [m, K]
        else:
            p = self.sampling.probs(logits)  # [m, K, V] float32
            draws = torch.stack([rows.rngs.exponential(DRAFT + i, (vocab,), p.device, rows=ready)
                                 for i in range(heads)], 1)  # [m, K, V]: one launch a head
            picked = race(p, draws)  # [m, K]
            top = p.max(-1).values
            probs = torch.zeros(count, heads, vocab, device=rows.device)
            probs[index] = p.float()
        tokens[index], confidence[index] = picked, top.float()
        sizes = [min(gammas[b], heads) if b in ready else 0 for b in range(count)]
        return DraftBatch(tokens, self._lengths(tuple(sizes)), tuple(gammas), probs, confidence, counts=tuple(sizes))

    def _trees(self, logits: torch.Tensor, ready: list[int], gammas: list[int]) -> DraftBatch:
        """The configured candidate paths no deeper than the heads run, for every ready row:
        path [i, j] is head 1's i-th best token followed by head 2's j-th best. logits [K, m, V]
        of the ready rows; the tree's shape is the same for every row (host ints, copied to the
        device once a depth), the others padding nodes."""
        ranks, depth_of, rank_of, parents, depth = self._shape(logits.shape[0], logits.device)
        ranked = logits.topk(ranks, dim=-1).indices  # [K, m, ranks]
        tokens = ranked[depth_of, :, rank_of].T.contiguous()  # [m, N]: node i's token in each ready row
        count = len(ready)
        return DraftBatch.of_rows(ready, len(gammas), tokens, depth.expand(count).contiguous(), gammas,
                                  tree=parents.expand(count, -1).contiguous())

    def _shape(self, heads: int, device: torch.device) -> tuple:
        """The tree's paths no deeper than `heads`: the ranks to take (host), each node's depth - 1,
        rank and parent ([N] each) and the tree's depth (0-d), on the device, made once a depth."""
        if heads not in self._shapes:
            choices = [c for c in self.tree if len(c) <= heads]
            index = {tuple(c): i for i, c in enumerate(choices)}
            parents = [index[tuple(c[:-1])] if len(c) > 1 else -1 for c in choices]
            table = torch.tensor([[len(c) - 1 for c in choices], [c[-1] for c in choices], parents]).to(device)
            depth = torch.tensor(max(len(c) for c in choices)).to(device)
            self._shapes[heads] = (1 + max(max(c) for c in choices), *table, depth)
        return self._shapes[heads]

    def memory(self) -> dict[str, int]:
        return {"heads": module_bytes(self.heads)}  # the shared LM head is the target's

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        # each row's verify row that predicted the token just emitted: its feature drafts the next ones
        final = out.hidden[FINAL]  # [B, n, H]
        if len(host) == 1:  # a view: no index to copy, no gather
            features = final[0, host[0].last_row][None]  # [1, H]
        else:
            last = torch.tensor([v.last_row for v in host]).to(final.device, non_blocking=True)
            features = final[torch.arange(len(host), device=final.device), last]  # [B, H]
        if self.features is None or self.features.shape[0] < len(self.ready):
            self.features = features.new_zeros(len(self.ready), features.shape[-1])
            if self.graphs is not None:
                self.graphs.clear()  # the graph read the old buffer
        self.features[: len(host)] = features
        self.ready[: len(host)] = [True] * len(host)


def check_tree(tree: list[list[int]], num_heads: int) -> list[list[int]]:
    """Medusa's `medusa_choices`, checked and ordered so that parents come first."""
    paths = sorted({tuple(int(i) for i in path) for path in tree}, key=lambda p: (len(p), p))
    for path in paths:
        if not path or min(path) < 0 or len(path) > num_heads or (len(path) > 1 and path[:-1] not in paths):
            raise SpecpipeError(
                f"proposer.tree has the path {list(path)}: every path must be non-empty, of non-negative ranks, "
                f"at most {num_heads} long (one rank per head), and its prefixes must be paths too, e.g. "
                "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]."
            )
    return [list(p) for p in paths]


def validate_options(options: dict) -> None:
    """The tree's shape, checked before the heads load (`check_tree` then bounds it by them)."""
    tree, num_heads = options.get("tree"), options.get("num_heads")
    if tree is not None and not all(isinstance(path, list) and all(type(i) is int for i in path) for path in tree):
        raise SpecpipeError(f"proposer.tree={tree!r} must be a list of paths, each a list of ranks, e.g. "
                            "[[0], [1], [0, 0], [0, 1]]")
    if num_heads is not None and num_heads < 1:
        raise SpecpipeError(f"proposer.num_heads={num_heads} must be at least 1 (or null: all heads)")


def build(*, context, heads: str, num_heads: int | None = None, tree: list | None = None) -> MedusaProposer:
    """heads: a folder written by `specpipe train proposer=medusa` (checked against the target
    before any weights load); num_heads: use only the first ones; tree: candidate paths
    (`medusa_choices`), verified in one forward, or None for a chain."""
    loaded = load_medusa(heads)
    if num_heads is not None:
        loaded.num_heads = max(1, min(num_heads, loaded.num_heads))
    return MedusaProposer(loaded, context.sampling, tree)


def _vllm(plan) -> None:
    plan.warnings.append(f"vLLM {plan.version} has no Medusa (method medusa is gone from its SpeculativeConfig): the "
                         "command serves the plain target and the heads' speedup is lost. Train an EAGLE head "
                         "(specpipe train proposer=eagle), which both engines serve.")
    return None


def _sglang(plan) -> None:
    plan.warnings.append(f"SGLang {plan.version} has no Medusa (its algorithms: {', '.join(plan.methods)}): the command "
                         "serves the plain target, and the heads' speedup is lost. Train an EAGLE head "
                         "(specpipe train proposer=eagle), which both engines serve.")
    return None


DECLARATION = Declaration("medusa", heads=True, hidden="last", tree="option", trainer="specpipe.train.medusa",
                          export={"vllm": _vllm, "sglang": _sglang})
