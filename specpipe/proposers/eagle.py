"""`proposer=eagle`: an EAGLE head drafts on the target's features, a chain or a dynamic tree.

The drafting here serves EAGLE-3 too (specpipe/proposers/eagle3.py): a head declares the target
layers it reads (`hidden_layers`: EAGLE the LM head's input, EAGLE-3 three decoder layers, fused
by the head's `fuse`) and scores tokens through a `DraftLM` (EAGLE: rows of the target's LM head;
EAGLE-3: its own LM head over its draft vocabulary). Everything else is this one implementation.

The head keeps its own KV cache of rows (f_i, token i+1), one per committed position, every
one computed from the target's true features; the verify forward's features of the newly
committed tokens become the pending rows that the next `propose` feeds first: its last output
guesses the feature of the last committed token, whose LM-head logits give draft token 1. Each
further draft token feeds the previous guess back as a feature. Every drafting row of a batch
goes through the same forwards (eagle_graph.py: one feed, then one forward a depth, over a
`SlotCache` of every row), eagerly or as CUDA graphs where the target's steps are graphed.

Tree mode is EAGLE-2's dynamic tree (eagle_tree.py): expand the `top_k` best nodes of each
depth by cumulative draft log-probability, then rerank every node made and keep the best
`nodes` (a child never outscores its parent: the kept set is a tree). Every drafting row is
searched at once, to the deepest γ, each depth one head forward over the top_k nodes of every
row (graphed: one graph), and each row's tree is cut at its own γ; the kept trees stay
on the device, parents included: one tree batch, its rows padded to the most nodes (drafts.py).
Every depth is expanded: stopping once `nodes` nodes outscore the frontier would need a read.

With `lookup` a step first tries a model-free draft and asks the head only where it finds
none: `ngram` (prompt lookup, proposer=ngram's matcher) drafts what followed an earlier
occurrence of the text's last n tokens; `suffix` (proposer=suffix's trees, over this request
and earlier requests' answers) drafts where its draft's score reaches `lookup_score`: Arctic
Inference's hybrid of suffix decoding and a model speculator. A lookup wins where the answer
copies its input or an earlier answer (code edits, summaries, repeated requests), the head where
there is nothing to copy (chat, math). The head skips those steps; their committed rows wait
in `pending` and are fed, in order, at its next draft, so its cache stays exact.

"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpipe.declaration import Declaration, sglang_chain
from specpipe.drafts import DraftBatch, tree_depth
from specpipe.engine import FINAL, Runner, TargetOutput
from specpipe.errors import SpecpipeError
from specpipe.engine.static import MAX_BLOCK
from specpipe.heads.eagle import EagleHead, SlotCache
from specpipe.proposers.draft_lm import DraftLM
from specpipe.heads.io import load_eagle
from specpipe.models.quantize import check_mode, resolve_precision, module_bytes, quantize_model
from specpipe.proposers.base import Proposer
from specpipe.proposers.eagle_graph import CacheRows, HeadGraphs, Sampled, chain, feed_rows
from specpipe.proposers.eagle_tree import TreeShape, kept, search
from specpipe.proposers.lookup import lookup_warning, make_lookup
from specpipe.sampling import DRAFT, SamplingParams
from specpipe.types import Rows, RowVerdict, Verdict

FILL_MIN = 8  # head rows a step's draft feeds along (more: `fill`, timed apart)


class _HeadRow:
    """One sequence's head state: its head rows fed so far (computed from true target features:
    its row of the head cache holds them at slots [0, committed)), and the committed rows not fed
    yet (features [m, H] and their tokens [m], on the device)."""

    def __init__(self, pending: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.committed = 0
        self.pending = pending


class EagleProposer(Proposer):
    def __init__(self, head: EagleHead, sampling: SamplingParams, tree: TreeShape | None = None,
                 quantize: str = "none", layers: tuple[int, ...] = (FINAL,),
                 draft_lm: Callable[[Runner], "DraftLM"] | None = None,
                 lookup: Proposer | None = None):
        """layers: the target's hidden-state keys the head reads, in the order its `fuse` takes
        them; draft_lm: target -> the head's token scorer (default: the target's LM-head rows
        of the head's draft vocabulary, in the `quantize` precision); lookup: a model-free draft
        (`make_lookup`) tried before the head each step (None: the head always drafts)."""
        self.head = head
        self.lookup = lookup
        self.sampling = sampling
        self.tree = tree
        self.quantize = quantize
        self.hidden_layers = tuple(layers)
        self.draft_lm = draft_lm or (lambda target: DraftLM.target_rows(target, head.draft_vocab, quantize))
        self.target: Runner | None = None
        self.lm: DraftLM | None = None
        self.cache = SlotCache()  # every row's head rows
        self.graphs: HeadGraphs | None = None  # drafts as graphs, where the target's steps are graphed
        self.rows: dict[int, _HeadRow] = {}
        self.vocab_size: int | None = None

    def widest(self, gamma: int, trees: bool) -> int:
        return max(gamma, self.tree.nodes) if self.tree is not None and trees else gamma

    def bind(self, target: Runner) -> None:
        self.target = target
        self.vocab_size = target.vocab_size
        if target.device.type != "cpu":  # the head and its draft rows live beside the target
            self.head = self.head.to(target.device)
        self.lm = self.draft_lm(target)
        graphed = getattr(target, "graphed", False)  # a trainer's frozen target is no Runner
        self.graphs = None
        if graphed:  # slots for the longest row and a draft past it: a chain γ - 1 rows, a tree k a depth
            top_k = 1 if self.tree is None else self.tree.top_k
            self.cache = SlotCache(target.cache.capacity + MAX_BLOCK * top_k, self.cache.rows)
            self.graphs = HeadGraphs(target.device, self.cache)

    def reserve(self, rows: int) -> None:
        self.cache.ensure(rows, 0)

    def prefill(self, row: int, prompt: list[int], out: TargetOutput | None) -> None:
        # the target's prefill saw prompt[:-1]: rows (f_i, prompt[i+1])
        pending = None
        if out is not None:
            pending = (self._features(out, 0), torch.tensor(prompt[1:], dtype=torch.long).to(out.logits.device))
        self.rows[row] = _HeadRow(pending)
        if self.lookup is not None:
            self.lookup.prefill(row, prompt)

    @torch.inference_mode()
    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """Feed the head the committed rows it has not seen (its prompt on a request's first
        draft, or a pause's rows) but the last, which the draft itself feeds for its root: every
        such row in one forward. Only a backlog longer than `FILL_MIN`: a few rows cost the
        draft's forward no more."""
        lagging = [row for row, gamma in enumerate(gammas) if gamma and row in self.rows
                   and self.rows[row].pending is not None and len(self.rows[row].pending[1]) > FILL_MIN]
        if lagging:
            self._feed_pending(lagging, keep_last=True)

    @torch.inference_mode()
    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        """Every row's draft: a lookup's where it finds one (per row: host text matching), else
        the head's, every such row's chain or tree in one head forward a depth."""
        trees = rows.trees and self.tree is not None
        found: list = [None] * len(gammas)  # a lookup's (tokens, parents or None) per row
        heads = []
        for row, gamma in enumerate(gammas):
            if gamma <= 0:
                continue
            if self.lookup is not None:
                found[row] = self.lookup.lookup(rows.tokens[row], gamma, row, trees=trees)
                if found[row] is not None:
                    continue  # the head's pending rows wait for its next draft
            if self.rows[row].pending is not None:  # else a one-token prompt: no feature yet
                heads.append(row)
        looked = any(f is not None for f in found)
        lookups = None
        if looked or not heads:  # the lookups' rows as host tensors (the others empty)
            lookups = DraftBatch.of_lists(gammas, [None if f is None else f[0] for f in found],
                                          [None if f is None else f[1] for f in found])
        if not heads:
            return lookups
        root = self._feed_pending(heads)
        if trees:
            drafted = self._trees(heads, root, [gammas[row] for row in heads])
        else:
            tokens, probs, confidence, count = self._chain(heads, root, [gammas[row] for row in heads], rows)
            drafted = DraftBatch(tokens, count, tuple(gammas[row] for row in heads), probs, confidence)
        if not looked:  # no lookup drafted: the head's tensors are the batch's
            return DraftBatch.of_rows(heads, len(gammas), drafted.tokens, drafted.num_draft, gammas, drafted.probs,
                                      drafted.confidence, drafted.tree)
        return lookups.merged(heads, drafted)

    def release(self, row: int, tokens: list[int]) -> None:
        if self.lookup is not None:  # a suffix lookup's global tree takes the finished output
            self.lookup.release(row, tokens)

    def memory(self) -> dict[str, int]:
        rows = 0 if self.lm is None or self.lm.rows is None else module_bytes(self.lm.rows)
        lookup = {} if self.lookup is None else self.lookup.memory()
        return {"heads": module_bytes(self.head) + rows, "head KV cache": self.cache.bytes(), **lookup}

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        for row, state in self.rows.items():
            if row < len(host):
                self._commit_row(row, state, verdict, host[row], out)

    def _commit_row(self, row: int, state: _HeadRow, verdict: Verdict, host: RowVerdict, out: TargetOutput) -> None:
        # rows of the verify block on the accepted path: the features of the last committed
        # token and of each accepted draft token, each paired with the token that followed it;
        # the drafted rows past `committed` in the head cache are scratch, overwritten next
        block_rows = [0, *host.path] if host.path else list(range(host.n_accepted + 1))
        features = self._features(out, row, block_rows)
        tokens = verdict.ids[row, : host.n_accepted + 1]  # [n + 1] the emitted tokens, still on the device
        if state.pending is not None:  # a step without a draft (γ = 0) left its rows unfed: keep them, in order
            features, tokens = torch.cat([state.pending[0], features]), torch.cat([state.pending[1], tokens])
        state.pending = (features, tokens)

    def _features(self, out: TargetOutput, row: int, block_rows: list[int] | None = None) -> torch.Tensor:
        """The head's input features [n, H] of batch row `row` at the block's `block_rows` (all:
        None), from the target's layers. A chain's rows are the block's first: views, no gather."""
        if block_rows is None or block_rows == list(range(len(block_rows))):
            rows = slice(None if block_rows is None else len(block_rows))
            states = [out.hidden[key][row, rows] for key in self.hidden_layers]
        else:  # a tree's path
            index = torch.tensor(block_rows).to(out.hidden[self.hidden_layers[0]].device, non_blocking=True)
            states = [out.hidden[key][row, index] for key in self.hidden_layers]
        return self.head.fuse(states[0] if len(states) == 1 else torch.cat(states, -1))

    def _feed(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache,
              mask: torch.Tensor | None = None) -> torch.Tensor:
        """Head rows (features [A, n, H], tokens [A, n], positions [A, n]) through the head over
        `cache` (a `SlotCache.at`'s rows and slots) -> guessed next features [A, n, H];
        mask [A, n, width] (None: causal)."""
        own = getattr(self.head, "embed_tokens", None)  # a third-party EAGLE-3 head may bring its own
        embeds = self.target.embed(tokens) if own is None else own(tokens).float()
        return self.head(embeds, features, positions, mask, cache)

    def _rows(self, heads: list[int], device: torch.device) -> CacheRows:
        """The cache rows of rows `heads` (on the CPU no kernel: a host tensor, made and used there)."""
        return CacheRows(torch.tensor(heads).to(device), heads == list(range(len(heads))))

    def _feed_pending(self, heads: list[int], keep_last: bool = False) -> torch.Tensor:
        """The pending rows of rows `heads` fed to the head in one forward, each padded to the
        longest -> the head's guess of each row's last fed token's feature [A, H]. keep_last
        (a fill, eager): each row's last pending row waits, for the draft's own feed."""
        states = [self.rows[row] for row in heads]
        pending = [(f[:-1], t[:-1]) if keep_last else (f, t) for f, t in (s.pending for s in states)]
        counts, fed = [len(tokens) for _, tokens in pending], [s.committed for s in states]
        n = max(counts)
        if len(heads) == 1:
            features, tokens = pending[0][0][None], pending[0][1][None]
        else:
            first = pending[0][0]
            features = first.new_zeros(len(heads), n, first.shape[-1])  # [A, n, H] the padding: scratch rows
            tokens = torch.zeros(len(heads), n, dtype=torch.long, device=first.device)  # [A, n]
            for a, (f, t) in enumerate(pending):
                features[a, : counts[a]], tokens[a, : counts[a]] = f, t
        self.cache.ensure(max(heads) + 1, max(fed) + n)
        if self.graphs is not None and not keep_last and self.graphs.feeds(n):
            root = self.graphs.feed(heads, features, tokens, fed, counts, self._feed)
        else:
            device, ragged = features.device, min(counts) < n
            root = feed_rows(self._feed, self.cache, self._rows(heads, device), features, tokens,
                             torch.tensor(fed).to(device), torch.tensor(counts).to(device) if ragged else None,
                             max(fed) + n, ragged or len(set(fed)) > 1)
        for state, count in zip(states, counts):
            state.committed += count
            state.pending = tuple(t[-1:] for t in state.pending) if keep_last else None
        return root

    def _chain(self, heads: list[int], root: torch.Tensor, gammas: list[int], rows: Rows) -> tuple:
        """The chains of rows `heads` from their roots [A, H] -> (tokens [A, W], distributions
        [A, W, V] or None, confidence [A, W], tokens counted [A]). A sampled chain draws position
        i in one launch for the rows on the run's stream; a seeded row, from its own (what it drew alone)."""
        gamma, starts, device = max(gammas), [self.rows[row].committed for row in heads], root.device
        stops = [rows.stop_below(i) for i in range(gamma)]
        sampled = None
        if not self.sampling.greedy:
            def draw(i: int, out: torch.Tensor) -> torch.Tensor:  # out [A, V]: one launch for the unseeded rows
                return rows.rngs.exponential_(out, DRAFT + i, rows=heads)
            sampled = Sampled(lambda hidden: self.sampling.probs(self.lm(hidden)), draw, self.lm.vocab_size)
        self.cache.ensure(max(heads) + 1, max(starts) + gamma)
        if self.graphs is not None and self.graphs.takes(gamma):
            return self.graphs.chain(heads, root, starts, gammas, stops, self._feed, self.lm.top, sampled)
        limits = torch.tensor(gammas).to(device) if min(gammas) < gamma else None  # rows asked for fewer
        draws = None if sampled is None else (
            lambda i: draw(i, root.new_empty(len(heads), sampled.size, dtype=torch.float32)))
        return chain(self._feed, self.lm.top, self.cache, self._rows(heads, device), root,
                     torch.tensor(starts).to(device), gamma, [max(starts) + i + 1 for i in range(gamma - 1)],
                     stops, limits, sampled, draws, len(set(starts)) > 1, device.type == "cpu")

    def _trees(self, heads: list[int], root: torch.Tensor, depths: list[int]) -> DraftBatch:
        """EAGLE-2's search of rows `heads` from their roots [A, H], all together to the deepest
        γ (`eagle_tree.search`: one head forward a depth; stopping early would need a read), each
        row's tree cut at its own (`kept`) -> a batch of A trees on the device, padded with NO_NODE."""
        k = min(self.tree.top_k, self.lm.size)  # never more children than draftable tokens
        depth, starts, device = max(depths), [self.rows[row].committed for row in heads], root.device
        self.cache.ensure(max(heads) + 1, max(starts) + depth * k)
        if self.graphs is not None and self.graphs.takes(depth):
            nodes = self._graphed_tree(heads, root, starts, k, depth)
        else:
            nodes = search(self._feed, self.lm.top, self.cache, self._rows(heads, device), root,
                           torch.tensor(starts).to(device), k, [max(starts) + d * k for d in range(1, depth)])
        tokens, parents, confidence = kept(*nodes, k, depths, self.tree.nodes)  # [A, N]
        return DraftBatch(tokens, tree_depth(parents), tuple(depths), None, confidence, parents)

    def _graphed_tree(self, heads: list[int], root: torch.Tensor, starts: list[int], k: int,
                      depth: int) -> tuple[torch.Tensor, ...]:
        """The search as one graph over every row (`HeadGraphs.tree`), every depth of it."""
        return self.graphs.tree(heads, root, starts, k, depth, self._feed, self.lm.top)


def validate_options(options: dict) -> None:
    """EAGLE-2's tree shape and the lookup's settings, checked before the head loads."""
    make_lookup(options.get("lookup", False), options.get("lookup_min", 3), options.get("lookup_max", 4),
                options.get("lookup_score"))
    tree = options.get("tree")
    if tree is not None and (set(tree) - {"top_k", "nodes"} or not all(type(v) is int for v in tree.values())):
        raise SpecpipeError(f"proposer.tree={tree!r} must be {{top_k: N, nodes: M}} with integers, e.g. "
                            "proposer.tree={top_k: 4, nodes: 16}")
    if tree is not None:
        TreeShape(**tree)


def build(*, context, heads: str, tree: dict | None = None, quantize: str = "auto", lookup: bool | str = False,
          lookup_min: int = 3, lookup_max: int = 4, lookup_score: float | None = 1.0) -> EagleProposer:
    """heads: a folder written by `specpipe train proposer=eagle` (checked against the target
    before any weights load); tree: {top_k, nodes} for EAGLE-2's dynamic tree, or None for a
    chain; quantize: the head's precision (drafts may use any: the target verifies them);
    lookup: ngram (or true; matches of lookup_min..lookup_max tokens) or suffix (drafts scoring
    lookup_score) tried before the head each step (false: the head only; see `make_lookup`)."""
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    quantize = quantize if context.device == "cpu" else "none"  # packed kernels are the CPU's; a head is small
    shape = None if tree is None else TreeShape(**dict(tree))
    # float32 first whatever the file holds: plain half-precision Linear layers are slow on CPUs
    # without native half arithmetic (this one has none); fbgemm's kernels read fp16 and compute in fp32
    head = quantize_model(load_eagle(heads).float(), quantize)
    lookup = make_lookup(lookup, lookup_min, lookup_max, lookup_score)
    return EagleProposer(head, context.sampling, shape, quantize, lookup=lookup)


def _vllm(plan) -> dict:
    """The heads folder is already vLLM's EAGLE layout; vLLM shares the target's embeddings and
    LM head with it, as specpipe does."""
    from specpipe.heads.io import read_config

    read_config(plan.heads, "eagle")  # a clear error now, not at vLLM's start-up
    lookup_warning(plan, f"vLLM {plan.version}")
    if plan.tree:
        plan.warnings.append(f"proposer.tree: vLLM {plan.version} drafts EAGLE as a chain (it has no token tree); "
                             f"EAGLE-2's dynamic tree is exported as a chain of γ={plan.gamma}.")
    return {"method": "eagle", "model": plan.heads, "num_speculative_tokens": plan.gamma}


def _sglang(plan) -> dict:
    """SGLang's EAGLE drafts EAGLE-2's dynamic tree itself: depth γ, top-k per step, and the
    number of nodes kept (plus the verified token)."""
    lookup_warning(plan, f"SGLang {plan.version}")
    shape = sglang_chain(plan.gamma) if not plan.tree else {
        "--speculative-num-steps": plan.gamma, "--speculative-eagle-topk": int(plan.tree["top_k"]),
        "--speculative-num-draft-tokens": int(plan.tree["nodes"]) + 1}
    return {"--speculative-algorithm": "EAGLE", "--speculative-draft-model-path": plan.heads, **shape}


DECLARATION = Declaration("eagle", heads=True, hidden="last", tree="option", early_stop=True, lookup=True,
                          trainer="specpipe.train.eagle", export={"vllm": _vllm, "sglang": _sglang})
