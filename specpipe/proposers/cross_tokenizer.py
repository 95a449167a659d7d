"""`CrossDrafter`: a draft model whose tokenizer differs from the target's (`proposer=draft`
picks it when the two tokenizers differ).

The draft reads the committed text in its own tokens: after each verdict the target's tokens
are decoded and re-encoded with the draft's tokenizer, and the draft's KV cache is cropped to
the longest prefix it shares with them (usually all but the last few tokens), so only the tail
is fed again. The draft drafts by token-level intersection (TLI, Timor et al. 2025; vLLM
`use_heterogeneous_vocab`): it picks only among tokens whose text exists in both vocabularies
(one draft id a text), from its own distribution restricted to them, and a table on the device
gives each pick's target id.

- greedy (temperature 0): the argmax of that restricted distribution. Greedy verification keeps
  only what the target itself would emit, so any draft is safe.
- sampling: a draw from it (sampling settings applied there); that distribution, placed at the
  target's ids of those tokens, is the draft's `probs` for rejection sampling. The target's
  distribution is never restricted: a token outside the intersection is still emitted through
  the recovered-token residual, so the output is distributed exactly as the target's.

The draft loop stays on the device (each drafted token feeds the next forward there; the
controller's early stop is a mask, as `ModelDrafter`'s), and a step reads the host once, the
verdict's copy: nothing is read before the target's forward, and the draft's cache keeps the
accepted drafted tokens by their target ids in that copy (a shared target id is one draft id).

`translate="text"` (`proposer.translate=text`) drafts greedily by universal assisted generation
instead (as transformers' UAG): the draft decodes γ of its own tokens, and their text, re-encoded
by the target's tokenizer after a few committed tokens of context, becomes a draft of up to γ
target tokens. It reaches target tokens the draft's vocabulary lacks (Qwen2.5's one token for
"):" and a line break, or "_code", each two of SmolLM2's), so a code target accepts more of it,
but the drafted ids are read before the target's forward (a second read a step): their text
must go through both tokenizers on the host, which no table of ids does exactly (the target's
merges cross the draft's token boundaries). docs/proposers.md has the two measured side by side.

`translate="auto"` (the default) takes `text` where the draft runs on the CPU, whose reads wait
for no device (a CPU step reads each draft position already: `still_drafting`), and `shared`
on a GPU, where a read is a sync that stalls the queue.
"""

from __future__ import annotations

import torch

from specpipe.declaration import batch_refusal
from specpipe.drafts import DraftBatch
from specpipe.engine import Runner, TargetOutput, make_runner
from specpipe.errors import SpecpipeError
from specpipe.proposers.base import Proposer
from specpipe.proposers.model_drafter import Drafted
from specpipe.sampling import DRAFT, SamplingParams, race
from specpipe.types import Rows
from specpipe.types import RowVerdict, Verdict

TRANSLATIONS = ("auto", "shared", "text")  # how a greedy draft reaches target ids (`CrossDrafter`)
LOOKBEHIND = 4  # committed target tokens re-encoded with a draft's text, so its first token splits as in running text


def check_translate(translate: str) -> str:
    """`translate` if it names a translation, else the error saying which do."""
    if translate not in TRANSLATIONS:
        raise SpecpipeError(f"proposer.translate={translate!r}: pick one of {', '.join(TRANSLATIONS)}")
    return translate


def translation(translate: str, device: torch.device) -> str:
    """The translation a greedy draft on `device` takes: "auto" is "text" on the CPU (its reads
    are free, and the text reaches target tokens the draft's vocabulary lacks), "shared" elsewhere."""
    if check_translate(translate) != "auto":
        return translate
    return "text" if torch.device(device).type == "cpu" else "shared"


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


def _byte_fallback(token: str) -> bool:
    """SentencePiece's spelling of a byte it has no piece for ("<0x0A>")."""
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


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
        elif _byte_fallback(token):
            texts[index] = ("text", bytes([int(token[3:5], 16)]))
        else:
            texts[index] = ("text", token.replace("\u2581", " ").encode())
    return texts


class SharedVocab:
    """The tokens both tokenizers have, by text: draft_ids[i] and target_ids[i] are the same text,
    one draft id a text (where the draft spells a text twice, as SentencePiece's " " and its byte
    fallback "<0x20>", the spelling it writes in running text), so a target id is one draft id
    (`to_draft`): a drafted token's probability is one entry, and the host knows which draft id
    an accepted target token was."""

    def __init__(self, target_tokenizer, draft_tokenizer):
        by_text = {text: index for index, text in token_texts(target_tokenizer).items()}
        spelled = {index: token for token, index in draft_tokenizer.get_vocab().items()}
        self.to_draft: dict[int, int] = {}  # target id -> draft id of the same text
        for d, text in sorted(token_texts(draft_tokenizer).items(),
                              key=lambda item: (_byte_fallback(spelled[item[0]]), item[0])):
            if text in by_text:
                self.to_draft.setdefault(by_text[text], d)
        pairs = sorted((d, t) for t, d in self.to_draft.items())
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
    `cached` mirrors the draft's cache in draft ids (as many as it holds). translate: how a
    greedy draft reaches target ids, "shared" (the shared tokens' table, on the device), "text"
    (its text re-encoded on the host) or "auto" (text on the CPU, shared on a GPU); a sampled
    draft is always "shared"."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingParams, target_tokenizer, draft_tokenizer, *,
                 engine: str = "auto", precision: str = "none", cache_len: int | None = None, device: str = "cpu",
                 translate: str = "auto"):
        self.runner = make_runner(model, engine=engine, precision=precision, cache_len=cache_len, device=device,
                                  graphs="off")
        self.sampling = sampling
        self.target_tok, self.draft_tok = target_tokenizer, draft_tokenizer
        self.shared = SharedVocab(target_tokenizer, draft_tokenizer)
        device = self.runner.device  # the shared ids on the device too: a draft is translated there
        self.draft_ids, self.target_ids = self.shared.draft_ids.to(device), self.shared.target_ids.to(device)  # [S]
        self.cached: list[int] = []  # the draft ids whose keys and values are in the draft's cache
        self._synced: tuple[int, list[int]] | None = None  # this step's fill: (committed length, ids left to feed)
        self._behind = True  # plain steps (or a new prompt) committed text the draft has not seen
        self._fed = 0  # drafted tokens this step's draft fed into the draft's cache
        self.text = translation(translate, self.runner.device) == "text" and sampling.greedy  # UAG
        self.target_vocab = len(target_tokenizer)  # the target's logits width, set by bind

    @classmethod
    def on(cls, context, model: torch.nn.Module, draft_tokenizer, precision: str,
           translate: str = "auto") -> "CrossDrafter":
        return cls(model, context.sampling, context.tokenizer, draft_tokenizer, engine=context.engine,
                   precision=precision, cache_len=context.cache_len, device=context.device, translate=translate)

    @property
    def batch_refusal(self) -> str | None:
        return batch_refusal(translated=True)

    def bind(self, target: Runner) -> None:
        self.target_vocab = self.vocab_size = target.vocab_size

    def prefill(self, row: int, prompt: list[int], out=None) -> None:
        self.runner.reset()
        self.cached = []
        self._behind = True
        self._fed = 0

    def commit(self, verdict: Verdict, host: list[RowVerdict], out: TargetOutput) -> None:
        if host and host[0].gamma == 0:  # a plain step: the next draft first catches up (`fill`)
            self._behind = True
        elif host and not self.text:  # the cache keeps the accepted drafted tokens it was fed, by their draft
            # ids: one a shared target id, so the verdict's copy says them (no read of the drafted ids)
            self.cached += [self.shared.to_draft[t] for t in host[0].accepted_tokens[: self._fed]]
            self.runner.crop(0, len(self.cached))
        self._fed = 0

    def memory(self) -> dict[str, int]:
        used = self.runner.memory()
        return {"draft weights": used.weights, "draft KV cache": used.cache}

    def _sync(self, tokens: list[int]) -> list[int]:
        """Crop the draft's cache to what it shares with the committed text in draft tokens;
        returns the draft ids to feed (at least one: the forward that predicts the next)."""
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
            self._fed += 1
        count, _ = drafted.counts()  # [1] how many count (the controller's early stop), on the device
        if self.text:
            tokens = torch.cat([token for token, _, _ in picks])  # [n] draft ids, on the device
            return DraftBatch.of_lists(gammas, [self._translated(committed, tokens, count, gamma)])
        targets = torch.cat([target for _, target, _ in picks])[None]  # [1, n] target ids, on the device
        probs = None if self.sampling.greedy else torch.stack([p for _, _, p in picks])[None]  # [1, n, V]
        if drafted.count is None:  # every position counts: the host knows the length
            n = targets.shape[1]
            return DraftBatch(targets, torch.full((1,), n, device=targets.device), gammas, probs, counts=(n,))
        return DraftBatch(targets, count[:1], gammas, probs)

    def _pick(self, logits: torch.Tensor, rows: Rows, row: int, position: int):
        """One draft token from logits [V_draft], on the device: (its draft id [1], its target id
        [1] unless its text is translated, the draft's distribution [V] at the target's ids if
        sampled, its top probability [1])."""
        if self.text:  # the draft's own argmax: its text is translated after the draft
            token = logits.argmax().view(1)
            return token, None, None, torch.softmax(logits.float(), -1).gather(0, token)
        if self.sampling.greedy:  # temperature 0 of the restricted distribution a sampled draft draws from
            restricted = logits[self.draft_ids]  # [S] the draft's logits at the shared tokens
            pick = restricted.argmax().view(1)
            top = torch.softmax(restricted.float(), -1).gather(0, pick)
            return self.draft_ids[pick], self.target_ids[pick], None, top
        shared = self.sampling.probs(logits[self.draft_ids])  # [S] the draft restricted to shared tokens
        draws = rows.rngs.exponential(DRAFT + position, shared.shape, shared.device, rows=[row])[0]  # [S]
        pick = race(shared, draws).view(1)
        placed = torch.zeros(self.target_vocab, dtype=torch.float32, device=shared.device)  # [V] at the target's ids
        placed[self.target_ids] = shared.float()
        return self.draft_ids[pick], self.target_ids[pick], placed, shared.max().view(1)

    def _translated(self, committed: list[int], tokens: torch.Tensor, count: torch.Tensor, gamma: int) -> list[int]:
        """`translate="text"`: the drafted text in target tokens. Text goes through two tokenizers
        on the host, so the drafted ids and their count come back in ONE read (no table can do
        this exactly: the target splits the text by its own merges, across the draft's boundaries).
        The draft's cache holds what was fed: all but the last counted token (on a GPU an early
        stop drafted on, and what followed it is cropped here)."""
        *draft, n = torch.cat([tokens, count]).tolist()
        self.cached += draft[: n - 1]
        self.runner.crop(0, len(self.cached))
        return self._translate(committed, draft[:n])[:gamma]

    def _translate(self, committed: list[int], draft: list[int]) -> list[int]:
        """The draft's text in target tokens, split as the target's tokenizer would in running text."""
        text = self.draft_tok.decode(draft)
        tail = committed[-LOOKBEHIND:]
        ids = self.target_tok.encode(self.target_tok.decode(tail) + text, add_special_tokens=False)
        if ids[: len(tail)] == tail:
            return ids[len(tail):]
        return self.target_tok.encode(text, add_special_tokens=False)
