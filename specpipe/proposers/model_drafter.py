"""`ModelDrafter`: drafts γ tokens autoregressively from a (smaller or quantized) causal LM.

Shared by the `draft` proposer (an independent model) and the `twin` proposer (the target's own
weights at a cheaper precision). The drafter keeps its own KV cache of the same rows as the
target's, filled when a row first drafts (not at its prompt: a request held at γ = 0 never pays
for the draft); each draft step is one forward of every drafting row. After each verdict a row's cache
is cropped to the longest prefix it shares with the committed tokens, and its next draft first
feeds whatever committed tokens it lacks (the last token, plus the last draft token when all γ
were accepted): rows lag by one or two, so that first forward is ragged, right-padded, each
row's logits read at its own last fed token. Tokens stay on the device from one draft step to
the next; the controller's early stop is a mask on the device (see `still_drafting`).
"""

from __future__ import annotations

from functools import partial

import torch

from specpipe.declaration import batch_refusal
from specpipe.drafts import DraftBatch
from specpipe.engine import Tail, TailInputs, make_runner, pick_engine
from specpipe.proposers.base import Proposer, still_drafting
from specpipe.sampling import DRAFT, SamplingParams, race
from specpipe.types import Rows
from specpipe.types import RowVerdict, Verdict

FEED = 2  # tokens a draft's first forward feeds a row: its last draft token and the bonus, when all were kept


class ModelDrafter(Proposer):
    def __init__(self, model: torch.nn.Module, sampling: SamplingParams, *, engine: str = "auto",
                 precision: str = "none", cache_len: int | None = None, device: str = "cpu", graphs: str = "auto"):
        """model: the draft's weights (the hf engine quantizes them in place to `precision`; with
        engine=llamacpp its GGUF source, on llama.cpp's fastest kernels: the target verifies it);
        graphs: as the target's (`auto`: the native engine's static step on CUDA, each draft step
        a replayed CUDA graph), always with the fewest rows (`kernels=fast`: the target verifies)."""
        native = engine != "llamacpp" and pick_engine(model, engine, precision) == "native"
        self.runner = make_runner(model, engine=engine, precision=precision, cache_len=cache_len, device=device,
                                  kernels="fast", graphs=graphs if native else "off")  # static steps are native's
        self.runner.plan(FEED)
        self.sampling = sampling
        self.base: list[int] = [0]  # per row: committed length when its last draft was proposed
        self.fed: list[int] = [0]  # per row: draft tokens its last draft fed into the cache

    @classmethod
    def on(cls, context, model: torch.nn.Module, precision: str) -> "ModelDrafter":
        """A drafter on the pipeline's engine, device and cache length (a build context's)."""
        return cls(model, context.sampling, engine=context.engine, precision=precision,
                   cache_len=context.cache_len, device=context.device, graphs=context.graphs)

    @property
    def batch_refusal(self) -> str | None:
        return batch_refusal(draft_engine=self.runner.engine if self.runner.max_rows == 1 else None)

    def reserve(self, rows: int) -> None:
        self.runner.reserve(rows)
        if len(self.base) < rows:
            self.base, self.fed = [0] * rows, [0] * rows

    def prefill(self, row: int, prompt: list[int], out=None) -> None:
        """The row starts empty: its first draft feeds the prompt (`fill`), so a request that
        never drafts (the guard holding it at γ = 0) never pays the draft's prefill."""
        self.runner.reset(row)
        self.fed[row] = 0

    @torch.inference_mode()
    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """A drafting row lacking more than the usual one or two tokens (its prompt, or what a
        pause at γ = 0 committed) gets a prefill of its own, so the ragged first draft forward
        stays narrow for every row instead of padding each one to the longest lag."""
        for row, gamma in enumerate(gammas):
            start = self.runner.lengths[row]
            if gamma and len(rows.tokens[row]) - start > FEED:  # no copy of a row's tokens unless it lags
                self.runner.prefill(row, rows.tokens[row][start:-1])

    @torch.inference_mode()
    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        count, device, steps = len(gammas), self.runner.device, max(gammas, default=0)
        feeds = [rows.tokens[b][self.runner.lengths[b]:] if gammas[b] else [] for b in range(count)]
        width = max(len(feed) for feed in feeds)  # every drafting row lacks at least its last token
        # [B, w] on the host: the runner sends it with its other inputs (a static step: one copy)
        ids = torch.tensor([feed + [feed[-1] if feed else 0] * (width - len(feed)) for feed in feeds])
        last = [max(len(feed) - 1, 0) for feed in feeds]  # [B] each row's last fed token, in the block
        kept = [len(feed) for feed in feeds]
        drafted = Drafted(gammas, device)
        tokens, probs, confidence = [], [], []
        for i in range(steps):
            tail = self._tail(rows, gammas, i, last)
            out = self.runner.forward(ids, tail=tail)  # logits [B, w, V], or the tail's output
            self.runner.commit(kept)  # padding and rows done drafting drop what they were fed
            # the pick inside the draft step's graph where it has one, else the same tail eagerly
            token, p, top = self._picked(out.tail if out.tail is not None else self._pick(tail, ids, out.logits))
            tokens.append(token)
            confidence.append(top)
            if p is not None:
                probs.append(p)
            drafted.add(i)
            if i + 1 == steps or not drafted.goes_on(i, top, rows.stop_below(i)):
                break  # the controller's call: γ logic stays out of the proposer
            ids, last = token[:, None], [0] * count
            kept = [int(i + 1 < g) for g in gammas]
        for b, gamma in enumerate(gammas):
            if gamma:
                self.base[b], self.fed[b] = len(rows.tokens[b]), min(len(tokens), gamma) - 1
        num_draft, counts = drafted.counts()
        return DraftBatch(torch.stack(tokens, 1), num_draft, tuple(gammas), torch.stack(probs, 1) if probs else None,
                          torch.stack(confidence, 1), counts=counts)

    def _tail(self, rows: Rows, gammas: list[int], position: int, last: list[int]) -> Tail:
        """One draft token per row as a `Tail` of the draft step (run inside its graph, or eagerly
        by `_pick`): greedy, the argmax; sampled, a race whose draws the step's randomness makes
        for this position (one launch for the rows without a seed; a row past its γ draws none
        of its own: its token is not kept), drawn into the tail's buffer before the replay.
        last: each row's last fed column in the block."""
        if self.sampling.greedy:
            return Tail("greedy pick", greedy_pick, last)

        def fill(buffers: list[torch.Tensor]) -> None:  # [R, V]
            rows.rngs.exponential_(buffers[0][: len(gammas)], DRAFT + position,
                                   skip=[position >= gamma for gamma in gammas])

        return Tail(f"sampled pick {self.sampling}", partial(sampled_pick, self.sampling), last,
                    TailInputs(fill, lambda block, vocab: ((vocab,),)))

    @staticmethod
    def _picked(tail: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(tokens [B], distributions [B, V] if sampled, top probabilities [B]) from a pick tail's output."""
        if tail.dtype == torch.long:  # greedy_pick's
            return tail[:, 0], None, tail[:, 1].int().view(torch.float32)
        vocab = tail.shape[1] - 2  # sampled_pick's
        return tail[:, vocab].long(), tail[:, :vocab], tail[:, vocab + 1]

    @staticmethod
    def _pick(tail: Tail, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The pick of an eager draft step: the tail a static step runs inside its graph, run over
        the step's own block (logits [B, w, V] of ids [B, w]: no padding), its inputs at their
        exact sizes and filled by its own `fill`, so both draw the same from the same streams."""
        rows, device = logits.shape[0], logits.device
        at = torch.tensor(tail.counts).to(device, non_blocking=True)  # [B] each row's last fed column
        sizes = tail.inputs.sizes(logits.shape[1], logits.shape[2]) if tail.inputs is not None else ()
        inputs = [torch.empty((rows, *size), device=device) for size in sizes]
        if tail.inputs is not None:
            tail.inputs.fill(inputs)
        return tail.compute(logits, ids, at, *inputs)

    def commit(self, verdict: Verdict, host: list[RowVerdict], out=None) -> None:
        for b, row in enumerate(host):
            if row.gamma > 0:  # the cache holds committed[:base] + draft[:fed]
                self.runner.crop(b, self.base[b] + min(row.n_accepted, self.fed[b]))
                self.fed[b] = 0

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}


class Drafted:
    """How many tokens each row has drafted. While only the rows' γ end them, the host knows
    (min(γ, positions drafted)), so a draft position costs no launch of bookkeeping; from the
    first position where the controller may stop a row early (on its confidence, a device
    value), the count goes on on the device, where a GPU reads nothing to learn which row
    stopped (`still_drafting`)."""

    def __init__(self, gammas: list[int], device: torch.device):
        self.gammas, self.device = gammas, device
        self.positions = 0  # draft positions done
        self.budget = self.alive = self.count = None  # [B] each on the device, once a stop may come

    def add(self, position: int) -> None:
        """Position `position` is drafted: count it for the rows still drafting."""
        self.positions = position + 1
        if self.count is not None:
            self.alive &= self.budget > position
            self.count += self.alive.long()

    def goes_on(self, position: int, top: torch.Tensor, threshold: float) -> bool:
        """After `position`, rows whose confidence top [B] fell below `threshold` stop: whether
        any row may draft on (on a GPU: always, see `still_drafting`)."""
        if threshold <= 0:  # no confidence stops a row here
            return True
        if self.count is None:  # the first early stop: the counts so far go to the device
            self.budget, self.count = torch.tensor([self.gammas, self.host()]).to(self.device, non_blocking=True)
            self.alive = self.budget > position
        return still_drafting(self.alive, top, threshold, self.device)

    def host(self) -> list[int]:
        return [min(gamma, self.positions) for gamma in self.gammas]

    def counts(self) -> tuple[torch.Tensor, tuple[int, ...] | None]:
        """(num_draft [B] on the device, the same as host ints where the host knows them)."""
        if self.count is not None:
            return self.count, None
        host = tuple(self.host())
        return torch.tensor(host).to(self.device, non_blocking=True), host


def greedy_pick(logits: torch.Tensor, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The greedy pick as a `Tail` of a draft step: logits [R, K, V] of the (padded) block, each
    row's last fed column `last` [R] -> [R, 2] int64: the argmax token, and its softmax
    probability's float32 bits (one int64 tensor copies out of the graph as one;
    `.int().view(float32)` reads them back exactly)."""
    top, token = torch.softmax(_last_fed(logits, last).float(), -1).max(-1)
    return torch.stack([token, top.view(torch.int32).long()], 1)


def sampled_pick(sampling: SamplingParams, logits: torch.Tensor, ids: torch.Tensor, last: torch.Tensor,
                 draws: torch.Tensor) -> torch.Tensor:
    """The sampled pick as a `Tail`: logits [R, K, V] of the (padded) block, each row's last
    fed column [R], the race's draws [R, V] -> [R, V + 2] float32: the distribution, the token
    (exact in float32: ids below 2 ** 24) and its top probability. One tensor copies out of the
    graph as one."""
    p = sampling.probs(_last_fed(logits, last))  # [R, V]
    return torch.cat([p, race(p, draws)[:, None].float(), p.max(-1, keepdim=True).values], 1)


def _last_fed(logits: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """logits [R, K, V] of a padded draft block -> [R, V] at each row's last fed column `last` [R]."""
    column = last.clamp(0, logits.shape[1] - 1)  # padding rows' counts are stale
    return logits.gather(1, column[:, None, None].expand(-1, 1, logits.shape[2]))[:, 0]
