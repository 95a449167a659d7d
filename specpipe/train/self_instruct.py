"""Instructions the target writes itself (Magpie: Xu et al. 2024, "Alignment Data Synthesis from
Scratch by Prompting Aligned LLMs with Nothing").

An instruction-tuned model given its chat template up to the start of a user turn (system
prompt included, as every user's request gets it) writes a user's request: sampled at
temperature 1, each one different, and in the distribution the model was tuned on, which is
what its users ask. The templates of train/prompts.py cover five kinds of request with a few
hundred phrasings; a head trained on the answers to them drafts far better on held-out
answers to the same templates than on the users' own requests (SmolLM2: τ 2.27 against
1.50). Self-written requests aim at that gap without a dataset: nothing leaves the
machine and no benchmark prompt is seen. Measured (docs/training.md): +0.1 τ on chat for
SmolLM2; nothing for Qwen2.5-Coder-1.5B, whose requests from an empty user turn are poor.

Requests are sampled in rounds of `batch`, each row with its own seed (`seed`, round, row), so
the list is a fixed sequence for a seed: a longer run reuses a shorter one's. Every sample is
appended to a JSONL file under the cache as its round finishes, kept or not, so an interrupted
run resumes where it stopped. A sample is kept if the model ended its turn (not cut at
`max_tokens`), has at least MIN_WORDS words and was not written before.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.errors import SpecpipeError

MIN_WORDS = 4
MAX_ROUNDS_PER_KEPT = 4  # samples tried per instruction kept before the model is judged unable to write them
MARK = "\x00"  # a user message that cannot occur in a template: where the user's turn starts


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user's message starts (system prompt included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecpipeError("instructions=self needs a chat model: the target writes the requests from its chat "
                            "template's user turn, and this tokenizer has no chat_template. Use "
                            "instructions=templates (the offline templates) or distill_prompts=FILE.")
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], add_generation_prompt=False,
                                         tokenize=False)
    return tokenizer(text[: text.index(MARK)], add_special_tokens=False)["input_ids"]


def sample_rows(runner, loaded, batch: int, temperature: float = 1.0, top_p: float = 0.95):
    """A function (prefix ids, max_tokens, seeds) -> the model's sampled continuations of the
    prefix, one a seed, `batch` rows decoding at once on `runner` (specpipe's batched decoding,
    each row with its own generator)."""
    from specpipe.pipeline import Pipeline, Request
    from specpipe.sampling import SamplingParams
    from specpipe.verifiers.rejection import RejectionVerifier

    sampling = SamplingParams(temperature=temperature, top_p=top_p)
    pipeline = Pipeline(loaded, None, RejectionVerifier(sampling), None, sampling=sampling, runner=runner)

    def sample(prefix: list[int], max_tokens: int, seeds: list[int]) -> list[tuple[str, bool]]:
        """(text, whether the model ended its turn) per seed."""
        requests = [Request(list(prefix), max_tokens, seed) for seed in seeds]
        tokens, ended = [[] for _ in seeds], [False] * len(seeds)
        for event in pipeline.serve(requests, concurrency=batch, speculative=False):
            tokens[event.index].extend(event.tokens)
            if event.finish_reason is not None:
                ended[event.index] = event.finish_reason == "eos"
        texts = [loaded.tokenizer.decode(ids, skip_special_tokens=True) for ids in tokens]  # the EOS dropped
        return list(zip(texts, ended))

    return sample


def instructions(sample, prefix: list[int], count: int, seed: int, path: Path, *, batch: int = 32,
                 max_tokens: int = 64, on_round=None) -> list[str]:
    """`count` self-written instructions (the first `count` of the seed's sequence), reading
    the rounds already sampled from `path`. sample: `sample_rows`'s function."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rounds = _read(path)
    kept = _kept(rounds)
    while len(kept) < count:
        n = len(rounds)
        if n * batch > MAX_ROUNDS_PER_KEPT * count + batch:
            raise SpecpipeError(f"instructions=self: the target wrote {len(kept)} usable requests in {n * batch} "
                                f"samples (a usable one ends its turn within {max_tokens} tokens, has {MIN_WORDS}+ "
                                "words and is new), short of the "
                                f"{count} asked. Use instructions=templates or mixed, or distill_prompts=FILE.")
        seeds = [(seed * 1_000_003 + n) * 1_009 + row for row in range(batch)]
        samples = sample(prefix, max_tokens, seeds)
        with path.open("a") as f:
            f.write(json.dumps({"round": n, "samples": samples}) + "\n")
        rounds.append(samples)
        kept = _kept(rounds)
        if on_round:
            on_round(min(len(kept), count))
    return kept[:count]


def _kept(rounds: list[list]) -> list[str]:
    out, seen = [], set()
    for samples in rounds:
        for text, ended in samples:
            text = text.strip()
            if ended and len(text.split()) >= MIN_WORDS and text not in seen:
                seen.add(text)
                out.append(text)
    return out


def _read(path: Path) -> list[list]:
    """The rounds sampled so far, in order. A last line cut by an interruption is dropped from
    the file too, so the next append starts a whole line."""
    text = path.read_text() if path.exists() else ""
    rounds, kept = [], 0  # kept: characters of the whole lines read
    for line in text.splitlines(keepends=True):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            break
        if d.get("round") != len(rounds) or not line.endswith("\n"):
            break
        rounds.append(d["samples"])
        kept += len(line)
    if kept < len(text):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text[:kept])
        tmp.replace(path)
    return rounds
