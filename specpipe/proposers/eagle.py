"""`proposer=eagle`: an EAGLE head drafts on the target's features, a chain or a dynamic tree.

The drafting here serves EAGLE-3 too (specpipe/proposers/eagle3.py): a head declares the target
layers it reads (`hidden_layers`: EAGLE the LM head's input, EAGLE-3 three decoder layers, fused
by the head's `fuse`) and scores tokens through a `DraftLM` (EAGLE: rows of the target's LM head;
EAGLE-3: its own LM head over its draft vocabulary). Everything else is this one implementation.

The head keeps its own KV cache of rows (f_i, token i+1), one per committed position, every
one computed from the target's true features. After each verdict the cache is cropped back
to those rows, and the verify forward's features of the newly committed tokens become the
pending rows that the next `propose` feeds first: its last output guesses the feature of the
last committed token, whose LM-head logits give draft token 1. Each further draft token
feeds the previous guess back as a feature.

Tree mode is EAGLE-2's dynamic tree: expand the `top_k` best nodes of each depth by
cumulative draft log-probability (each expansion is one head forward over top_k rows, with a
tree mask on the head's cache), then rerank every node made and keep the best `nodes`.
Since a child's score never exceeds its parent's, the kept set is a tree, and the expansion
stops early once `nodes` nodes outscore the whole frontier (deeper nodes could not be kept).

With `lookup` a step first tries a model-free draft and asks the head only where it finds
none: `ngram` (prompt lookup, proposer=ngram's matcher) drafts what followed an earlier
occurrence of the text's last n tokens; `suffix` (proposer=suffix's trees, over this request
and earlier requests' answers) drafts where its draft's score reaches `lookup_score`: Arctic
Inference's hybrid of suffix decoding and a model speculator. A lookup wins where the answer
copies its input or an earlier answer (code edits, summaries, repeated requests), the head where
there is nothing to copy (chat, math). The head skips those steps; their committed rows wait
in `pending` and are fed, in order, at its next draft, so its cache stays exact.

Where the target's steps are graphed (CUDA graphs on a GPU) a chain, greedy or sampled, and a
tree search run as one graph each (eagle_graph.py) over a head cache of preallocated slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpipe.declaration import Declaration, batch_refusal, sglang_chain
from specpipe.drafts import DraftBlock, DraftTree
from specpipe.engine import FINAL, Runner, TargetOutput
from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import EagleHead, HeadCache, SlotCache
from specpipe.proposers.draft_lm import DraftLM
from specpipe.heads.io import load_eagle
from specpipe.models.quantize import check_mode, resolve_precision, module_bytes, quantize_model
from specpipe.proposers.base import RowProposer, still_drafting
from specpipe.proposers.eagle_graph import HeadGraphs, Sampled
from specpipe.proposers.eagle_tree import TreeSearch, rerank
from specpipe.proposers.lookup import lookup_warning, make_lookup
from specpipe.sampling import DRAFT, SamplingParams, race_draws, sample
from specpipe.types import Rows, RowVerdict, Verdict

FILL_MIN = 8  # head rows a step's draft feeds along (more: `fill`, timed apart)


@dataclass(frozen=True)
class TreeShape:
    top_k: int = 4  # children per expanded node, and nodes expanded per depth
    nodes: int = 16  # nodes kept after reranking: the size of the verify block (+1)

    def __post_init__(self):
        if self.top_k < 1 or self.nodes < 1:
            raise SpecpipeError(f"proposer.tree needs top_k >= 1 and nodes >= 1 (got top_k={self.top_k}, "
                                f"nodes={self.nodes}), e.g. proposer.tree={{top_k: 4, nodes: 16}}.")


class _HeadRow:
    """One sequence's head state: its cache, the rows in it computed from true target features,
    and the committed rows not fed yet (features [m, H] and their tokens [m], on the device)."""

    def __init__(self, pending: tuple[torch.Tensor, torch.Tensor] | None = None, cache: SlotCache | None = None):
        self.cache = cache if cache is not None else HeadCache()
        self.committed = 0
        self.pending = pending


class EagleProposer(RowProposer):
    def __init__(self, head: EagleHead, sampling: SamplingParams, tree: TreeShape | None = None,
                 quantize: str = "none", layers: tuple[int, ...] = (FINAL,),
                 draft_lm: Callable[[Runner], "DraftLM"] | None = None,
                 lookup: RowProposer | None = None):
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
        self.graphs: HeadGraphs | None = None  # drafts as graphs, where the target's steps are graphed
        self.rows: dict[int, _HeadRow] = {}

    def widest(self, gamma: int, trees: bool) -> int:
        return max(gamma, self.tree.nodes) if self.tree is not None and trees else gamma

    def bind(self, target: Runner) -> None:
        self.target = target
        self.vocab_size = target.vocab_size
        if target.device.type != "cpu":  # the head and its draft rows live beside the target
            self.head = self.head.to(target.device)
        self.lm = self.draft_lm(target)
        graphed = getattr(target, "graphed", False)  # a trainer's frozen target is no Runner
        top_k = 1 if self.tree is None else self.tree.top_k
        self.graphs = HeadGraphs(target.device, target.cache.capacity, top_k) if graphed else None

    def prefill(self, row: int, prompt: list[int], out: TargetOutput | None) -> None:
        # the target's prefill saw prompt[:-1]: rows (f_i, prompt[i+1])
        pending = None
        if out is not None:
            pending = (self._features(out, 0), torch.tensor(prompt[1:], dtype=torch.long).to(out.logits.device))
        self.rows[row] = _HeadRow(pending, None if self.graphs is None else self.graphs.cache(row))
        if self.lookup is not None:
            self.lookup.prefill(row, prompt)

    @torch.inference_mode()
    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """Feed the head the committed rows it has not seen (its prompt on a request's first
        draft, or a pause's rows) but the last, which the draft itself feeds for its root. Only
        a backlog longer than `FILL_MIN`: a few rows cost the draft's forward no more."""
        for row, gamma in enumerate(gammas):
            state = self.rows.get(row)
            if gamma and state is not None and state.pending is not None and len(state.pending[1]) > FILL_MIN:
                features, tokens = state.pending
                self._feed(features[:-1], tokens[:-1], _span(state.committed, len(tokens) - 1, features.device),
                           state.cache)
                state.committed += len(tokens) - 1
                state.pending = (features[-1:], tokens[-1:])

    @torch.inference_mode()
    def propose_row(self, row: int, rows: Rows, gamma: int) -> DraftBlock | DraftTree | None:
        if self.lookup is not None:
            copied = self.lookup.lookup(rows.tokens[row], gamma, row, trees=rows.trees and self.tree is not None)
            if copied is not None:
                return copied  # the head's pending rows wait for its next draft
        state = self.rows[row]
        if state.pending is None:
            return None  # a one-token prompt: no feature yet
        features, tokens = state.pending
        if self.graphs is not None and self.graphs.feeds(len(tokens)):
            root = self.graphs.feed(row, features, tokens, state.committed, self._feed)
        else:
            root = self._feed(features, tokens, _span(state.committed, len(tokens), features.device), state.cache)[-1]
        state.committed += len(tokens)  # the guess of the last committed token's feature is `root`
        state.pending = None
        graphed = self.graphs is not None and self.graphs.takes(gamma)
        if self.tree is not None and rows.trees:
            return self._graphed_tree(state, root, gamma, row) if graphed else self._tree(state, root, gamma)
        return (self._graphed_chain if graphed else self._chain)(state, root, gamma, rows, row)

    @property
    def batch_refusal(self) -> str | None:
        return batch_refusal(tree=self.tree is not None)

    def release(self, row: int, tokens: list[int]) -> None:
        if self.lookup is not None:  # a suffix lookup's global tree takes the finished output
            self.lookup.release(row, tokens)

    def memory(self) -> dict[str, int]:
        rows = 0 if self.lm is None or self.lm.rows is None else module_bytes(self.lm.rows)
        lookup = {} if self.lookup is None else self.lookup.memory()
        return {"heads": module_bytes(self.head) + rows,
                "head KV cache": sum(state.cache.bytes() for state in self.rows.values()), **lookup}

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        for row, state in self.rows.items():
            if row < len(host):
                self._commit_row(row, state, verdict, host[row], out)

    def _commit_row(self, row: int, state: _HeadRow, verdict: Verdict, host: RowVerdict, out: TargetOutput) -> None:
        # rows of the verify block on the accepted path: the features of the last committed
        # token and of each accepted draft token, each paired with the token that followed it
        block_rows = [0, *host.path] if host.path else list(range(host.n_accepted + 1))
        state.cache.crop(state.committed)
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
        """Rows (features [n, H], tokens [n], positions [n]) appended to a row's head `cache` ->
        guessed next features [n, H]; mask [1, n, cache + n] (None: causal)."""
        own = getattr(self.head, "embed_tokens", None)  # a third-party EAGLE-3 head may bring its own
        embeds = self.target.embed(tokens) if own is None else own(tokens).float()
        return self.head(embeds[None], features[None], positions[None], mask, cache)[0]

    def _graphed_chain(self, state: _HeadRow, root: torch.Tensor, gamma: int, rows: Rows, row: int) -> DraftBlock:
        """A chain as one graph (eagle_graph.py): every one of its γ tokens is drafted, and those
        after a stop are not counted, as the eager chain does on a GPU. A sampled chain's draws
        are the eager chain's (the row's generator for the step, per position), drawn first."""
        stops = [rows.stop_below(i) for i in range(gamma)]
        sampled = None if self.sampling.greedy else Sampled(
            lambda hidden: self.sampling.probs(self.lm(hidden)),
            lambda i, out: race_draws(out, rows.rngs[row](DRAFT + i, out.device)), self.lm.vocab_size)
        tokens, probs, confidence, count = self.graphs.chain(row, root, state.committed, stops, self._feed,
                                                             self.lm.top, sampled)
        return DraftBlock(tokens, probs, confidence, count)  # stacked into the batch (a copy) before the next replay

    def _graphed_tree(self, state: _HeadRow, root: torch.Tensor, depth: int, row: int) -> DraftTree:
        """EAGLE-2's search as one graph (eagle_graph.py), its every depth searched; the kept
        nodes are ranked from its outputs as the eager search ranks its own."""
        k = min(self.tree.top_k, self.lm.size)
        nodes = self.graphs.tree(row, root, state.committed, k, depth, self._feed, self.lm.top)
        return rerank(*nodes, self.tree.nodes)

    def _chain(self, state: _HeadRow, hidden: torch.Tensor, gamma: int, rows: Rows, row: int) -> DraftBlock:
        tokens, probs, confidence = [], [], []
        alive = torch.ones((), dtype=torch.bool, device=hidden.device)
        count = torch.zeros((), dtype=torch.long, device=hidden.device)  # tokens drafted before a stop
        for i in range(gamma):
            if self.sampling.greedy:
                logp, ids = self.lm.top(hidden, 1)
                token, top = ids[0], logp[0].exp()
            else:
                p = self.sampling.probs(self.lm(hidden))  # [V] float32, the target's transform
                token, top = sample(p, rows.rngs[row](DRAFT + i, p.device)), p.max()
                probs.append(p)
            tokens.append(token)
            confidence.append(top)
            count += alive.long()
            if i + 1 == gamma or not still_drafting(alive, top, rows.stop_below(i), hidden.device):
                break  # the controller's call: γ logic stays out of the proposer
            hidden = self._feed(hidden[None], token[None], _span(state.committed + i, 1, hidden.device),
                                state.cache)[-1]
        return DraftBlock(torch.stack(tokens), torch.stack(probs) if probs else None, torch.stack(confidence),
                          count)

    def _tree(self, state: _HeadRow, root: torch.Tensor, depth: int) -> DraftTree:
        """EAGLE-2's search on the device (`eagle_tree.TreeSearch`): each depth feeds the k best
        nodes of the last one to the head as one block and takes their k best children; the
        tree's shape is read back once, at the end. On the CPU, where a read costs no sync, the
        search also stops at the depth whose children could no longer be kept."""
        k = min(self.tree.top_k, self.lm.size)  # never more children than draftable tokens
        values, ids = self.lm.top(root, k)  # [k]
        search = TreeSearch(k, depth, root, values, ids)
        for d in range(1, depth):
            best = search.best()
            if root.device.type == "cpu" and bool(search.settled(best, self.tree.nodes)):
                break  # children score no more than their parent: none could rank among the nodes kept
            guesses, tokens, mask = search.block(best, state.committed)
            positions = torch.full((k,), state.committed + d - 1, device=root.device)  # one depth
            hidden = self._feed(guesses, tokens, positions, state.cache, mask)
            search.grow(best, hidden, *self.lm.top(hidden, k))  # [k, k]
        state.cache.crop(state.committed)  # drafting rows are never kept
        return search.rerank(self.tree.nodes)


def _span(start: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + count, device=device)


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
