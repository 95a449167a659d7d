"""`CrossDrafter`: a draft model whose tokenizer differs from the target's (`proposer=draft`
picks it when the two tokenizers differ).

The draft reads the committed text in its own tokens: after each verdict the target's tokens
are decoded and re-encoded with the draft's tokenizer, and the draft's KV cache is cropped to
the longest prefix it shares with them (usually all but the last few tokens), so only the tail
is fed again. Two ways to draft, by what the verifier needs:

- greedy (temperature 0): universal assisted generation (as transformers' UAG). The draft
  decodes γ of its own tokens; their text, re-encoded by the target's tokenizer after a few
  committed tokens of context, becomes a draft of up to γ target tokens. Greedy verification
  keeps only what the target itself would emit, so any draft text is safe.
- sampling: token-level intersection (TLI, Timor et al. 2025; vLLM `use_heterogeneous_vocab`).
  The draft samples only among tokens whose text exists in both vocabularies, from its own
  distribution restricted to them (sampling settings applied there); that distribution, placed
  at the target's ids of those tokens, is the draft's `probs` for rejection sampling. The target's
  distribution is never restricted: a token outside the intersection is still emitted through the
  recovered-token residual, so the output is distributed exactly as the target's.

Either way the draft loop stays on the device (each drafted token feeds the next forward there;
the controller's early stop is a mask, as `ModelDrafter`'s), and the proposer reads the host
once a step beside the verdict: greedy, the γ drafted ids before the target's forward, since
their text must go through both tokenizers on the host (a table of ids cannot translate it
exactly: the target's merges cross the draft's token boundaries); sampled, nothing before the
forward, since a shared token's target id is a table lookup on the device, and the drafted
draft ids after the verdict, for the draft's own cache (what it holds, compared with the next
re-encoding), when the verdict's copy has already waited for the device.
"""

from __future__ import annotations

import torch

from specpipe.declaration import batch_refusal
from specpipe.drafts import DraftBatch
from specpipe.engine import Runner, TargetOutput, make_runner
from specpipe.proposers.base import Proposer
from specpipe.proposers.model_drafter import Drafted
from specpipe.sampling import DRAFT, SamplingParams, sample
from specpipe.types import Rows
from specpipe.types import RowVerdict, Verdict

LOOKBEHIND = 4  # committed target tokens re-encoded with a draft's text, so its first token splits as in running text


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable bytes stand for themselves, the others for
    256 + n (the mapping every byte-level BPE tokenizer shares: Qwen, SmolLM2, Llama 3, GPT-2)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and '"ByteLevel"' in backend.to_str()


def token_texts(tokenizer) -> dict[int, tuple[str, bytes]]:
    """id -> what the token stands for, comparable across tokenizers: ("special", its string)
    for special tokens, ("text", its bytes) for the rest (byte-level BPE and SentencePiece
    spellings both normalised to bytes)."""
    special = set(tokenizer.all_special_ids)
    byte_level = _is_byte_level(tokenizer)
    decoder = _byte_decoder() if byte_level else {}
    texts = {}
    for token, index in tokenizer.get_vocab().items():
        if index in special or token in getattr(tokenizer, "added_tokens_encoder", {}):
            texts[index] = ("special", token)
        elif byte_level and all(c in decoder for c in token):
            texts[index] = ("text", bytes(decoder[c] for c in token))
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):  # SentencePiece byte fallback
            texts[index] = ("text", bytes([int(token[3:5], 16)]))
        else:
            texts[index] = ("text", token.replace("\u2581", " ").encode())
    return texts


class SharedVocab:
    """The tokens both tokenizers have, by text: draft_ids[i] and target_ids[i] are the same text."""

    def __init__(self, target_tokenizer, draft_tokenizer):
        by_text = {text: index for index, text in token_texts(target_tokenizer).items()}
        pairs = sorted((d, by_text[text]) for d, text in token_texts(draft_tokenizer).items() if text in by_text)
        self.draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)  # [S]
        self.target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)  # [S]
        self.draft_size, self.target_size = len(draft_tokenizer), len(target_tokenizer)

    @property
    def size(self) -> int:
        return int(self.draft_ids.numel())

    def describe(self) -> str:
        return (f"{self.size} tokens have the same text in both vocabularies ({self.size / self.draft_size:.0%} of "
                f"the draft's {self.draft_size}, {self.size / self.target_size:.0%} of the target's {self.target_size})")


class CrossDrafter(Proposer):
    """Host-bound by nature (text goes through two tokenizers each step): one sequence at a time.
    `cached` mirrors the draft's cache in draft ids (as many as it holds)."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingParams, target_tokenizer, draft_tokenizer, *,
                 engine: str = "auto", precision: str = "none", cache_len: int | None = None, device: str = "cpu"):
        self.runner = make_runner(model, engine=engine, precision=precision, cache_len=cache_len, device=device,
                                  graphs="off")
        self.sampling = sampling
        self.target_tok, self.draft_tok = target_tokenizer, draft_tokenizer
        self.shared = SharedVocab(target_tokenizer, draft_tokenizer)
        device = self.runner.device  # the shared ids on the device too: a sampled draft is translated there
        self.draft_ids, self.target_ids = self.shared.draft_ids.to(device), self.shared.target_ids.to(device)  # [S]
        self.cached: list[int] = []  # the draft ids whose keys and values are in the draft's cache
        self._synced: tuple[int, list[int]] | None = None  # this step's fill: (committed length, ids left to feed)
        self._behind = True  # plain steps (or a new prompt) committed text the draft has not seen
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None  # a sampled draft's ids and count, unread
        self.target_vocab = len(target_tokenizer)  # the target's logits width, set by bind

    @classmethod
    def on(cls, context, model: torch.nn.Module, draft_tokenizer, precision: str) -> "CrossDrafter":
        return cls(model, context.sampling, context.tokenizer, draft_tokenizer, engine=context.engine,
                   precision=precision, cache_len=context.cache_len, device=context.device)

    @property
    def batch_refusal(self) -> str | None:
        return batch_refusal(translated=True)

    def bind(self, target: Runner) -> None:
        self.target_vocab = self.vocab_size = target.vocab_size

    def prefill(self, row: int, prompt: list[int], out=None) -> None:
        self.runner.reset()
        self.cached = []
        self._behind = True
        self._pending = None

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        self._read_pending()
        if host and host[0].gamma == 0:  # a plain step: the next draft first catches up (`fill`)
            self._behind = True

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}

    def _sync(self, tokens: list[int]) -> list[int]:
        """Crop the draft's cache to what it shares with the committed text in draft tokens;
        returns the draft ids to feed (at least one: the forward that predicts the next)."""
        self._read_pending()
        ids = self.draft_tok.encode(self.target_tok.decode(tokens), add_special_tokens=False) or [0]
        keep = 0
        for cached, new in zip(self.cached, ids[:-1]):
            if cached != new:
                break
            keep += 1
        self.runner.crop(0, keep)
        self.cached = ids[:keep]
        return ids[keep:]

    @torch.inference_mode()
    def fill(self, rows: Rows, gammas: list[int]) -> None:
        """The draft's cache catches up with the committed text (its prompt on the first draft,
        or what plain steps committed) but the last draft id, which the draft feeds itself.
        After a drafting step there is nothing to fill: re-tokenising the text is each draft's
        own cost, so it stays in the draft."""
        if gammas and gammas[0] and self._behind:
            self._behind = False
            feed = self._sync(rows.tokens[0])
            if len(feed) > 2:
                self.runner.prefill(0, feed[:-1])
                self.cached += feed[:-1]
            self._synced = (len(rows.tokens[0]), feed[-1:] if len(feed) > 2 else feed)

    def propose(self, rows: Rows, gammas: list[int]) -> DraftBatch:
        """One sequence's draft (`batch_refusal`: a batch runs one at a time), row 0's."""
        if not gammas or gammas[0] <= 0:
            return DraftBatch.of_lists(gammas, [None] * len(gammas))
        return self._draft(rows, gammas[0], tuple(gammas))

    def _draft(self, rows: Rows, gamma: int, gammas: tuple[int, ...]) -> DraftBatch:
        row = 0
        committed = rows.tokens[row]
        synced, self._synced = self._synced, None
        feed = synced[1] if synced is not None and synced[0] == len(committed) else self._sync(committed)
        logits = self.runner.prefill(0, feed).logits[0, -1]  # [V_draft] on the device
        self.cached += feed
        drafted = Drafted([gamma], self.runner.device)
        picks = []  # per position: (draft id [1], target id [1] or None, distribution [V] or None)
        for i in range(gamma):
            token, target, placed, top = self._pick(logits, rows, row, i)
            picks.append((token, target, placed))
            drafted.add(i)
            if i + 1 == gamma or not drafted.goes_on(i, top, rows.stop_below(i)):
                break  # the controller's call (on a GPU every position is drafted, the count stays there)
            logits = self.runner.forward(token.view(1, 1)).logits[0, -1]  # [V_draft]: the draft feeds its own token
            self.runner.commit([1])
        tokens = torch.cat([token for token, _, _ in picks])  # [n] draft ids, on the device
        count, _ = drafted.counts()  # [1] how many count (the controller's early stop), on the device
        if self.sampling.greedy:
            return DraftBatch.of_lists(gammas, [self._translated(committed, tokens, count, gamma)])
        self._pending = (tokens, count)  # read after the verdict: the target's ids need no host (below)
        targets = torch.cat([target for _, target, _ in picks])[None]  # [1, n] target ids, on the device
        probs = torch.stack([p for _, _, p in picks])[None]  # [1, n, V]
        if drafted.count is None:  # every position counts: the host knows the length
            n = targets.shape[1]
            return DraftBatch(targets, torch.full((1,), n, device=targets.device), gammas, probs, counts=(n,))
        return DraftBatch(targets, count[:1], gammas, probs)

    def _pick(self, logits: torch.Tensor, rows: Rows, row: int, position: int):
        """One draft token from logits [V_draft], on the device: (its draft id [1], its target id
        [1] if sampled, the draft's distribution [V] at the target's ids if sampled, its top
        probability [1])."""
        if self.sampling.greedy:
            token = logits.argmax().view(1)
            return token, None, None, torch.softmax(logits.float(), -1).gather(0, token)
        shared = self.sampling.probs(logits[self.draft_ids])  # [S] the draft restricted to shared tokens
        pick = sample(shared, rows.rngs[row](DRAFT + position, shared.device)).view(1)
        placed = torch.zeros(self.target_vocab, dtype=torch.float32, device=shared.device)  # [V] at the target's ids
        placed[self.target_ids] = shared.float()
        return self.draft_ids[pick], self.target_ids[pick], placed, shared.max().view(1)

    def _translated(self, committed: list[int], tokens: torch.Tensor, count: torch.Tensor, gamma: int) -> list[int]:
        """Greedy: the drafted text in target tokens. Text goes through two tokenizers on the
        host, so the drafted ids and their count come back in ONE read (no table can do this
        exactly: the target splits the text by its own merges, across the draft's boundaries)."""
        *draft, n = torch.cat([tokens, count]).tolist()
        self._settle(draft, n)
        return self._translate(committed, draft[:n])[:gamma]

    def _settle(self, draft: list[int], n: int) -> None:
        """The draft's cache holds what was fed: all but the last counted token (on a GPU an
        early stop drafted on, and what followed it is cropped here)."""
        self.cached += draft[: n - 1]
        self.runner.crop(0, len(self.cached))

    def _read_pending(self) -> None:
        """A sampled draft's ids, for the draft's own cache: read once the verdict's copy has
        waited for the device (they were drafted before it), so the read waits for nothing."""
        if self._pending is not None:
            tokens, count = self._pending
            self._pending = None
            *draft, n = torch.cat([tokens, count]).tolist()
            self._settle(draft, n)

    def _translate(self, committed: list[int], draft: list[int]) -> list[int]:
        """The draft's text in target tokens, split as the target's tokenizer would in running text."""
        text = self.draft_tok.decode(draft)
        tail = committed[-LOOKBEHIND:]
        ids = self.target_tok.encode(self.target_tok.decode(tail) + text, add_special_tokens=False)
        if ids[: len(tail)] == tail:
            return ids[len(tail):]
        return self.target_tok.encode(text, add_special_tokens=False)
