"""Self-distillation: the frozen target's own greedy answers to offline instructions.

Heads are judged on what the target says, so its answers are the best training text there is.
Generating them is the slowest part of training on a CPU, so answers are appended to a JSONL
file under the cache as each batch finishes: an interrupted run resumes where it stopped, and
Medusa and EAGLE heads for the same target share one set of answers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from specpipe.models.zoo import cache_root


def cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "distill" / f"{Path(str(key['model']).rstrip('/')).name}-{digest}.jsonl"


def answers(model, tokenizer, prompts: list[str], max_new_tokens: int, path: Path, batch: int = 32,
            on_batch=None) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, the position of the last prompt token: the first whose prediction
    belongs to the answer) for every prompt, reading finished ones from `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = [d for d in done if "ids" in d]  # a line cut by an interruption is dropped
    for start in range(len(done), len(prompts), batch):
        rows = generate(model, tokenizer, prompts[start : start + batch], max_new_tokens)
        with path.open("a") as f:
            f.write("".join(json.dumps({"ids": ids, "start": first}) + "\n" for ids, first in rows))
        done += [{"ids": ids, "start": first} for ids, first in rows]
        if on_batch:
            on_batch(len(rows))
    return [(d["ids"], d["start"]) for d in done[: len(prompts)]]


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
