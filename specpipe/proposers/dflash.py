"""`proposer=dflash`: a DFlash drafter guesses a whole block in one forward, on the target's features.

The drafter (specpipe/heads/dflash.py) reads the target's hidden states after its
`target_layer_ids` at every committed position (the context) and fills a block of the last
committed token and γ mask tokens, all γ guesses at once, for every drafting row of the batch
in the same forward. Its block is γ + 1 wide, γ as the controller and the guard say, up to the
block it was trained on (`block_size - 1` guesses; a larger γ drafts that many).

Context: the drafter's layers read only the keys and values of the context rows, so each is
computed once, when its row is first fed, and kept in a cache of every row's context
(`ContextCache` in specpipe/heads/dflash.py: preallocated slots per row, lengths as host
ints). A verdict's accepted rows (the last committed token and the accepted drafts) are the
context its verify forward made the features of; they wait in `pending` and are fed in front
of the next draft (a prompt's, or a long pause's, in `fill`, timed apart). The bonus or recovered token has no feature yet: it is
the block's first row, as the last committed token of every draft is.

With `lookup` a step first tries a model-free draft per row (`ngram` or `suffix`, as
proposer=eagle's `make_lookup`) and the drafter drafts only the rows where it finds none;
their context waits in `pending` and is fed, in order, at their next draft.

Drafts stay on the device: the block's tokens and positions and the attention's row lengths
go there in small copies, and nothing is read back before the step's one host copy.
"""

from __future__ import annotations

import torch

from specpipe.declaration import Declaration
from specpipe.drafts import DraftBatch
from specpipe.engine import Runner, TargetOutput
from specpipe.heads.dflash import ContextCache, DFlashDrafter
from specpipe.heads.dflash_format import fit_summary, load_dflash
from specpipe.models.quantize import check_mode, module_bytes, quantize_model, resolve_precision
from specpipe.proposers.base import Proposer
from specpipe.proposers.draft_lm import DraftLM
from specpipe.proposers.lookup import lookup_warning, make_lookup
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import SuffixProposer
from specpipe.sampling import DRAFT, SamplingParams, race
from specpipe.types import Rows
from specpipe.types import RowVerdict, Verdict

FILL_MIN = 8  # context rows a draft feeds along (more: `fill`, timed apart)


class _Row:
    """One sequence's context: `length` rows cached, and committed rows' features not fed yet
    (`pending`: [m, k·H] tensors, in order)."""

    def __init__(self, pending: list[torch.Tensor]):
        self.length = 0
        self.pending = pending

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self.pending)


class DFlashProposer(Proposer):
    def __init__(self, drafter: DFlashDrafter, sampling: SamplingParams,
                 lookup: NgramProposer | SuffixProposer | None = None):
        """lookup: a model-free draft (proposer=eagle's `make_lookup`) tried first each step (None:
        the drafter always drafts)."""
        self.drafter = drafter
        self.sampling = sampling
        self.lookup = lookup
        self.hidden_layers = tuple(drafter.shape.target_layer_ids)
        self.target: Runner | None = None
        self.lm: DraftLM | None = None
        self.cache = ContextCache()
        self.rows: dict[int, _Row] = {}

    def widest(self, gamma: int, trees: bool) -> int:
        return gamma if self.lookup is not None else min(gamma, self.drafter.shape.gamma_max)

    def bind(self, target: Runner) -> None:
        self.target = target
        if target.device.type != "cpu":  # the drafter lives beside the target
            self.drafter = self.drafter.to(target.device)
        drafter = self.drafter
        if drafter.lm_head is None:  # the target's LM head, as z-lab's drafters are trained with
            self.lm = DraftLM(lambda hidden: drafter.scores(target.lm_head(hidden)), None, target.vocab_size)
        else:  # speculators' own head over a draft vocabulary
            self.lm = DraftLM(lambda hidden: drafter.scores(drafter.lm_head(hidden.to(drafter._dtype))),
                              drafter.draft_ids, target.vocab_size)

    def reserve(self, rows: int) -> None:
        self.cache.reserve(rows)

    def prefill(self, row: int, prompt: list[int], out: TargetOutput | None) -> None:
        # the target's prefill saw prompt[:-1]: the context of the first block, whose first row is prompt[-1]
        self.rows[row] = _Row([] if out is None else [self._features(out)[0]])
        if self.lookup is not None:
            self.lookup.prefill(row, prompt)

    @torch.inference_mode()
    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """Feed the context of drafting rows that lag by more than `FILL_MIN` rows (a prompt, a
        pause's rows): a few rows cost the draft no more, so only a backlog is timed apart."""
        self._feed([b for b, gamma in enumerate(gammas) if gamma and b in self.rows
                    and self.rows[b].waiting > FILL_MIN])

    @torch.inference_mode()
    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        found: list = [None] * len(gammas)  # a lookup's tokens per row (its drafts are chains)
        drafting = []
        for b, gamma in enumerate(gammas):
            if gamma == 0 or b not in self.rows:
                continue
            copied = None if self.lookup is None else self.lookup.lookup(rows.tokens[b], gamma, b, trees=False)
            if copied is not None and copied[0]:
                found[b] = copied[0]  # the row's context waits for its next draft
            else:
                drafting.append(b)
        lookups = DraftBatch.of_lists(gammas, found) if any(found) or not drafting else None
        if not drafting:
            return lookups
        self._feed([b for b in drafting if self.rows[b].pending])
        counts = [min(gammas[b], self.drafter.shape.gamma_max) for b in drafting]
        tokens, probs, confidence = self._draft(drafting, counts, rows)
        if lookups is not None:
            num_draft = torch.tensor(counts).to(tokens.device, non_blocking=True)
            return lookups.merged(drafting, DraftBatch(tokens, num_draft, tuple(counts), probs, confidence,
                                                       counts=tuple(counts)))
        return self._batch(drafting, counts, tokens, probs, confidence, gammas)

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        """The verify block's rows 0..n_accepted (the last committed token and the accepted
        drafts) are context now: their features wait for the next draft."""
        live = [b for b in self.rows if b < len(host)]
        if not live:
            return
        features = self._features(out)  # [B, n, k·H], a copy (a graphed forward reuses its buffers)
        for b in live:
            self.rows[b].pending.append(features[b, : host[b].n_accepted + 1])

    def release(self, row: int, tokens: list[int]) -> None:
        self.rows.pop(row, None)
        if self.lookup is not None:  # a suffix lookup's global tree takes the finished output
            self.lookup.release(row, tokens)

    def memory(self) -> dict[str, int]:
        lookup = {} if self.lookup is None else self.lookup.memory()
        return {"draft weights": module_bytes(self.drafter), "draft KV cache": self.cache.bytes(), **lookup}

    def _features(self, out: TargetOutput) -> torch.Tensor:
        """[B, n, k·H] the target's hidden states of the drafter's layers, concatenated."""
        return torch.cat([out.hidden[key] for key in self.hidden_layers], -1)

    def _feed(self, rows: list[int]) -> None:
        """The pending context of `rows` into the cache: one projection for all of them."""
        if not rows:
            return
        states = [self.rows[b] for b in rows]
        features = torch.cat([f for state in states for f in state.pending])  # [N, k·H]
        pairs = [(b, slot) for b, state in zip(rows, states)
                 for slot in range(state.length, state.length + state.waiting)]
        index = torch.tensor(pairs).T.to(features.device, non_blocking=True)  # [2, N]: row, slot (= position)
        keys, values = self.drafter.context(features, index[1])
        self.cache.write(index, keys, values, max(slot for _, slot in pairs) + 1)
        for state in states:
            state.length += state.waiting
            state.pending = []

    def _draft(self, drafting: list[int], counts: list[int], rows: Rows):
        """One forward over the blocks of `drafting` rows: tokens [B', W - 1], their draft
        distributions [B', W - 1, V] (sampled drafts; else None), confidence [B', W - 1]."""
        width, device = max(counts) + 1, self.target.device
        lengths = [self.rows[b].length for b in drafting]  # every row's context: positions 0..length-1
        mask_id = self.drafter.shape.mask_token_id
        host = torch.tensor([[rows.tokens[b][-1], *[mask_id] * (width - 1), length, n]
                             for b, length, n in zip(drafting, lengths, counts)])
        host = host.to(device, non_blocking=True)  # [B', W + 2]: ids, then each row's length and count
        ids, length, count = host[:, :width], host[:, width], host[:, width + 1]
        positions = length[:, None] + torch.arange(width, device=device)  # [B', W]: the last token at its own
        keys, values = self.cache.view(drafting, max(lengths))
        if keys.numel() == 0:
            keys = values = self._empty_context(len(drafting), device)
        hidden = self.drafter(self.target.embed(ids), positions, keys, values,
                              _mask(length, count, keys.shape[3], width, lengths, counts))[:, 1:]  # [B', W - 1, H]
        if self.sampling.greedy:
            logp, best = self.lm.top(hidden, 1)
            return best[..., 0], None, logp[..., 0].exp()
        p = self.sampling.probs(self.lm(hidden))  # [B', W - 1, V] float32, the target's transform
        draws = torch.stack([rows.rngs.exponential(DRAFT + j, p.shape[-1:], device, rows=drafting)
                             for j in range(width - 1)], 1)  # [B', W - 1, V]: one launch a position
        drafted = torch.arange(width - 1, device=device)[None] < count[:, None]  # [B', W - 1]
        tokens = torch.where(drafted, race(p, draws), p.argmax(-1))  # past a row's count: the argmax
        return tokens, p, p.max(-1).values

    def _empty_context(self, rows: int, device: torch.device) -> torch.Tensor:
        """[layers, B', kv heads, 0, d]: no row has context yet (every prompt was one token)."""
        attn = self.drafter.layers[0].self_attn
        return torch.empty(len(self.drafter.layers), rows, attn.kv_heads, 0, attn.head_dim, device=device,
                           dtype=self.drafter._dtype)

    def _batch(self, drafting: list[int], counts: list[int], tokens, probs, confidence, gammas) -> DraftBatch:
        """The drafted rows as the step's batch: a view where every row drafted, else padded."""
        rows = len(gammas)
        num = [0] * rows
        for b, n in zip(drafting, counts):
            num[b] = n
        if drafting != list(range(rows)):
            index = torch.tensor(drafting).to(tokens.device, non_blocking=True)
            tokens = tokens.new_zeros(rows, tokens.shape[1]).index_copy_(0, index, tokens)
            confidence = confidence.new_zeros(rows, confidence.shape[1]).index_copy_(0, index, confidence)
            if probs is not None:
                probs = probs.new_zeros(rows, *probs.shape[1:]).index_copy_(0, index, probs)
        num_draft = torch.tensor(num).to(tokens.device, non_blocking=True)
        return DraftBatch(tokens, num_draft, tuple(gammas), probs, confidence, counts=tuple(num))


def _mask(length: torch.Tensor, count: torch.Tensor, context: int, width: int, lengths: list[int],
          counts: list[int]) -> torch.Tensor | None:
    """[B', W, S + W] which keys each block row sees: its row's own context (slots < length) and
    its own block (the last token and `count` masks), so a row drafts in a batch as it does
    alone. None where every row sees every key (one row, or rows alike)."""
    if all(n == context for n in lengths) and all(n == width - 1 for n in counts):
        return None
    columns = torch.arange(context + width, device=length.device)  # [S + W]
    block = columns - context  # a block column's offset (negative: a context slot)
    seen = (columns < length[:, None]) | ((block >= 0) & (block <= count[:, None]))  # [B', S + W]
    return seen[:, None].expand(-1, width, -1)


def validate_options(options: dict) -> None:
    """The lookup's settings, checked before the drafter loads."""
    make_lookup(options.get("lookup", False), options.get("lookup_min", 3), options.get("lookup_max", 4),
                options.get("lookup_score"))


def build(*, context, heads: str, quantize: str = "auto", lookup: bool | str = False, lookup_min: int = 3,
          lookup_max: int = 4, lookup_score: float | None = 1.0) -> DFlashProposer:
    """heads: a DFlash drafter's folder, z-lab's or speculators' (checked against the target before
    any weights load); quantize: the drafter's precision (drafts may use any: the target verifies
    them); lookup: ngram (or true) or suffix tried before the drafter each step (false: the
    drafter only; see proposer=eagle's `make_lookup`)."""
    quantize = resolve_precision(check_mode(quantize, "proposer.quantize"), context.device, draft=True)
    quantize = quantize if context.device == "cpu" else "none"  # packed kernels are the CPU's
    # float32 first whatever the file holds, as proposer=eagle's heads: fbgemm reads fp16 and computes in fp32
    drafter = quantize_model(load_dflash(heads).float(), quantize)
    return DFlashProposer(drafter, context.sampling, make_lookup(lookup, lookup_min, lookup_max, lookup_score))


def _gamma(plan) -> int:
    """The exported γ: the plan's, up to the drafter's trained block (as specpipe drafts it)."""
    block = fit_summary(plan.heads)["block_size"]  # a clear error now, not at the engine's start-up
    if plan.gamma > block - 1:
        plan.warnings.append(f"γ={plan.gamma} is past the drafter's block of {block}: exported as γ={block - 1}, "
                             "the most it drafts in one forward.")
    return min(plan.gamma, block - 1)


def _vllm(plan) -> dict:
    """vLLM reads z-lab's and speculators' DFlash checkpoints itself (`method: dflash`)."""
    gamma = _gamma(plan)
    lookup_warning(plan, f"vLLM {plan.version}", "a DFlash drafter", "the drafter")
    return {"method": "dflash", "model": plan.heads, "num_speculative_tokens": gamma}


def _sglang(plan) -> dict:
    """SGLang's DFLASH: the block (γ + 1, the verified token included) as its draft tokens."""
    gamma = _gamma(plan)
    lookup_warning(plan, f"SGLang {plan.version}", "a DFlash drafter", "the drafter")
    return {"--speculative-algorithm": "DFLASH", "--speculative-draft-model-path": plan.heads,
            "--speculative-num-draft-tokens": gamma + 1, "--speculative-dflash-block-size": gamma + 1}


DECLARATION = Declaration("dflash", heads=True, hidden="layers", lookup=True, read_heads=fit_summary,
                          trainer="specpipe.train.dflash",
                          export={"vllm": _vllm, "sglang": _sglang})
