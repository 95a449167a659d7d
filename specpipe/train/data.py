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
