"""Self-distillation: the frozen target's own greedy answers to offline instructions.

Heads are judged on what the target says, so its answers are the best training text there is.
Generating them is the slowest part of training on a CPU, so answers are appended to a JSONL
file under the cache as each batch finishes: an interrupted run resumes where it stopped, and
Medusa and EAGLE heads for the same target share one set of answers. Each line carries a hash
of its prompt's text, so a cache whose prompt list grows or is edited keeps the answers that
still match and decodes the rest (lines written before the hash are taken by index).

On the native engine the answers come from specpipe's own batched decoding (`decode.loop.Decoder`,
continuous batching: a finished answer's row takes the next prompt at once, no padding);
otherwise from transformers' batched `generate` (static, left-padded batches). `specpipe train`
decodes them, and computes the features, with bf16's bulk kernels (models/quantize.py
`bulk_rows`): one call a block instead of exact 16-row blocks, about twice as fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from specpipe.models.zoo import cache_root

WINDOW = 8  # batches whose prompts are sorted by length together


def cache_file(key: dict, kind: str = "") -> Path:
    """The cache's JSONL for `key`; kind: a name part telling files of other contents apart."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = Path(str(key['model']).rstrip('/')).name
    return cache_root() / "distill" / f"{name}-{kind + '-' if kind else ''}{digest}.jsonl"


def answers(model, tokenizer, prompts: list[str], max_new_tokens: int, path: Path, batch: int = 32,
            on_batch=None, decode=None) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, the position of the last prompt token: the first whose prediction
    belongs to the answer) for every prompt, reading finished ones from `path`.

    decode: (prompts, max_new_tokens) -> such pairs (`batched_decoder`); None: transformers'
    `generate`, whose batch is left-padded to its longest prompt, and the prefill is most of the
    cost, so prompts are batched by length within windows of WINDOW batches (measured on SmolLM2:
    49 -> 78 answer tokens/s). Each line records its prompt's index, so the file is read back in
    prompt order."""
    decode = decode or (lambda texts, tokens: generate(model, tokenizer, texts, tokens))
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_cut_line(path)
    done = {i: (ids, first) for i, (ids, first, asked) in _read(path).items()
            if i < len(prompts) and asked in (None, prompt_hash(prompts[i]))}  # an edited prompt: answered again
    todo = [i for i in range(len(prompts)) if i not in done]
    for window in range(0, len(todo), batch * WINDOW):
        group = sorted(todo[window : window + batch * WINDOW], key=lambda i: len(prompts[i]))
        for start in range(0, len(group), batch):
            indices = group[start : start + batch]
            rows = decode([prompts[i] for i in indices], max_new_tokens)
            with path.open("a") as f:
                f.write("".join(json.dumps({"index": i, "prompt": prompt_hash(prompts[i]), "ids": ids, "start": first})
                                + "\n" for i, (ids, first) in zip(indices, rows)))
            done.update({i: (ids, first) for i, (ids, first) in zip(indices, rows)})
            if on_batch:
                on_batch(len(rows))
    return [done[i] for i in range(len(prompts))]


def prompt_hash(prompt: str) -> str:
    """What a cache line records of its prompt: enough to tell an edited one apart."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _drop_cut_line(path: Path) -> None:
    """An interruption can leave a last line without its newline; the next append would join it."""
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text[: text.rfind("\n") + 1])
        os.replace(tmp, path)


def _read(path: Path) -> dict[int, tuple[list[int], int, str | None]]:
    """Finished answers by prompt index, with their prompt's hash (None on older lines); a later
    line for an index (the answer to its edited prompt) replaces an earlier one. Lines without an
    index (written before batching by length) are in prompt order."""
    done: dict[int, tuple[list[int], int, str | None]] = {}
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else []):
        d = json.loads(line)
        done[d.get("index", n)] = (d["ids"], d["start"], d.get("prompt"))
    return done


def batched_decoder(runner, model, tokenizer, concurrency: int):
    """Greedy answers by specpipe's batched plain decoding on a native `runner`, `concurrency` at
    a time: the `decode` of `answers`. Prompts go through the chat template as `generate`'s do."""
    from specpipe.models.loader import LoadedModel
    from specpipe.pipeline import Pipeline
    from specpipe.verifiers.greedy import GreedyVerifier

    pipeline = Pipeline(LoadedModel("distill", model, tokenizer), None, GreedyVerifier(), None, runner=runner)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def decode(prompts: list[str], max_new_tokens: int) -> list[tuple[list[int], int]]:
        ids = [pipeline.encode(p) for p in prompts]
        outs = pipeline.generate_batch(ids, max_new_tokens=max_new_tokens, speculative=False,
                                       concurrency=concurrency)
        # the layout of `generate`'s rows: trailing pad ids stripped (the EOS, where it pads)
        return [(i + _strip(out.token_ids, pad), len(i) - 1) for i, out in zip(ids, outs)]

    return decode


def _strip(tokens: list[int], pad: int) -> list[int]:
    tokens = list(tokens)
    while tokens and tokens[-1] == pad:
        tokens.pop()
    return tokens


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[tuple[list[int], int]]:
    """One batch of greedy answers through the chat template (left padding, stripped again)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) if chat else p for p in prompts]
    side, pad_token = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs one; restored below
    pad = tokenizer.pad_token_id
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat)
        with torch.inference_mode():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad_token
    out = []
    for row, mask in zip(ids, enc["attention_mask"]):
        prompt_len = int(mask.sum())
        kept = row[len(mask) - prompt_len :].tolist()  # drop left padding
        while kept and kept[-1] == pad and len(kept) > prompt_len:
            kept.pop()  # and right padding after an early EOS
        out.append((kept, prompt_len - 1))
    return out
