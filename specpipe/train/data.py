"""Training text that exists offline: the Python standard library's sources (code) and the
documentation text shipped inside installed packages (prose). Deterministic: files are read
in sorted order, so the same settings give the same token stream on every machine with the
same Python and packages.
"""

from __future__ import annotations

import site
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from specpipe.errors import SpecpipeError

SOURCES = ("stdlib", "docs")
_DOC_SUFFIXES = (".md", ".rst", ".txt")


def texts(source: str) -> Iterator[str]:
    """A built-in source, or a path: a text file, or a folder of .py/.md/.rst/.txt files."""
    if Path(source).exists():
        path = Path(source)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".py", *_DOC_SUFFIXES))
    elif source == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(root.glob("*.py"))
    elif source == "docs":
        files = sorted(p for base in site.getsitepackages() for p in Path(base).glob("*/*")
                       if p.suffix in _DOC_SUFFIXES and p.is_file() and p.stat().st_size > 2000)
    else:
        raise SpecpipeError(f"sources has {source!r}: use {', '.join(SOURCES)}, or the path of a text file or "
                            "a folder of text files.")
    for path in files:
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def sequences(tokenizer, sources: list[str], seq_len: int, max_tokens: int) -> list[list[int]]:
    """Token sequences of `seq_len`, sources interleaved file by file, `max_tokens` in all."""
    streams = [texts(s) for s in sources]
    out: list[list[int]] = []
    total = 0
    while streams and total < max_tokens:
        for stream in list(streams):
            text = next(stream, None)
            if text is None:
                streams.remove(stream)
                continue
            ids = tokenizer(text)["input_ids"]
            for start in range(0, len(ids) - seq_len // 4, seq_len):
                chunk = ids[start : start + seq_len]
                out.append(chunk)
                total += len(chunk)
                if total >= max_tokens:
                    return out
    return out


def stdlib_prompts(count: int) -> list[str]:
    """Offline instructions for self-distillation, made from the standard library's documented
    functions ("Write `name(args)`: <its docstring's first line>"); never the benchmark prompts."""
    import ast

    prompts: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and not node.name.startswith("_"):
                args = ", ".join(a.arg for a in node.args.args)
                first = doc.strip().splitlines()[0]
                prompts.append(f"Write a Python function `{node.name}({args})`: {first}" if len(prompts) % 2 == 0
                               else f"Explain what `{path.stem}.{node.name}` does: {first}")
            if len(prompts) >= count:
                return prompts
    return prompts


def self_distilled(model, tokenizer, prompts: list[str], max_new_tokens: int, batch: int = 8) -> list[tuple[list[int], int]]:
    """The target's own greedy answers, generated in batches: (prompt + answer ids, the position
    of the last prompt token: the first whose prediction is part of the answer)."""
    import torch

    chat = bool(getattr(tokenizer, "chat_template", None))
    texts_in = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                              tokenize=False) if chat else p for p in prompts]
    side, pad_token = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs one; restored below
    pad = tokenizer.pad_token_id
    out = []
    try:
        for start in range(0, len(texts_in), batch):
            enc = tokenizer(texts_in[start : start + batch], return_tensors="pt", padding=True,
                            add_special_tokens=not chat)
            with torch.inference_mode():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
            for row, mask in zip(ids, enc["attention_mask"]):
                prompt_len = int(mask.sum())
                kept = row[len(mask) - prompt_len :].tolist()  # drop left padding
                while kept and kept[-1] == pad and len(kept) > prompt_len:
                    kept.pop()  # and right padding after an early EOS
                out.append((kept, prompt_len - 1))
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad_token
    return out
