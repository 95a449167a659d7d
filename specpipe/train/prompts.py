"""Offline instructions for self-distillation, in the kinds of requests users make: write code,
edit code, chat, summarize, arithmetic word problems.

Heads learn what the target says in answer to requests like these; heads trained only on
library source code and documentation guess poorly once the target answers a chat prompt
(measured: Medusa head 1 matched the target on 21% of chat positions). The material comes
from what is on every machine (the standard library's functions and docstrings, the text
shipped with installed packages) plus templates with random numbers and everyday topics, so
the set is large, deterministic for a seed, and never the benchmark prompts.
"""

from __future__ import annotations

import ast
import functools
import random
import re
import site
import sysconfig
from pathlib import Path

_TOPICS = (
    "a process and a thread", "RAM and disk storage", "a virus and a bacterium", "weather and climate",
    "a loan and a lease", "baking soda and baking powder", "a CPU and a GPU", "speed and velocity",
    "an LED and an incandescent bulb", "a stock and a bond", "HTTP and HTTPS", "a compiler and an interpreter",
    "a simile and a metaphor", "renting and buying a home", "a crocodile and an alligator", "Wi-Fi and Bluetooth",
    "a debit card and a credit card", "mitosis and meiosis", "latitude and longitude", "an email and a letter",
)
_ACTIVITIES = (
    "learning to cook at home", "preparing for a job interview", "starting to run", "keeping a houseplant alive",
    "saving money on groceries", "learning a new language", "planning a weekend trip", "sleeping better",
    "writing a cover letter", "organizing a small kitchen", "studying for an exam", "working from home",
    "giving a short presentation", "making friends in a new city", "reading more books", "training a puppy",
    "reducing screen time", "choosing a first laptop", "hosting a dinner party", "learning to play guitar",
)
_ASKS = (
    "What is the difference between {topic}? Give an everyday analogy.",
    "Explain {topic} to a twelve-year-old, in a few short paragraphs.",
    "I am interested in {activity}. How should I start, and what mistakes should I avoid?",
    "Give me five practical tips for {activity}, each with one sentence of explanation.",
    "Write a short, friendly email to a colleague about {activity}.",
    "Make a simple three-day plan for {activity}.",
)
_EDITS = (
    "Add type hints to this function and a docstring that explains its arguments. Do not change the behaviour. "
    "Return the full updated code.",
    "Rename the variables in this function to clearer names, keeping the behaviour the same. Return the full code.",
    "Add comments to this function that explain each step. Return the full code.",
    "Rewrite this function so it is easier to read, without changing what it does. Return the full code.",
)
_SUMMARIES = (
    "Summarize the following passage in three bullet points.",
    "Summarize this text in two sentences for a busy reader.",
    "What are the main points of the following text? Answer briefly.",
)
_LICENCE = re.compile(r"licen[cs]e|warrant|copyright|liabilit|GPL|legal entit", re.IGNORECASE)
_ITEMS = ("apples", "notebooks", "tickets", "coffees", "pencils", "sandwiches", "plants", "candles")


def instructions(count: int, seed: int = 0) -> list[str]:
    """`count` instructions, the five kinds taken in turn."""
    rng = random.Random(seed)
    functions = list(_stdlib_functions())  # shuffled below: a copy of the cached tuple
    rng.shuffle(functions)
    passages = list(_passages())
    rng.shuffle(passages)
    makers = [lambda i: _code(functions[i % len(functions)]), lambda i: _edit(functions[-1 - i % len(functions)], rng),
              lambda i: _chat(rng), lambda i: _summary(passages[i % len(passages)], rng) if passages else _chat(rng),
              lambda i: _math(rng)]
    return [makers[i % len(makers)](i // len(makers)) for i in range(count)]


def _code(fn: tuple[str, str, str, str]) -> str:
    name, args, doc, _ = fn
    return f"Write a Python function `{name}({args})`: {doc} Include a docstring and two example calls."


def _edit(fn: tuple[str, str, str, str], rng: random.Random) -> str:
    return f"{rng.choice(_EDITS)}\n\n```python\n{fn[3]}\n```"


def _chat(rng: random.Random) -> str:
    return rng.choice(_ASKS).format(topic=rng.choice(_TOPICS), activity=rng.choice(_ACTIVITIES))


def _summary(passage: str, rng: random.Random) -> str:
    return f"{rng.choice(_SUMMARIES)}\n\n{passage}"


def _math(rng: random.Random) -> str:
    item, n, price, paid = rng.choice(_ITEMS), rng.randint(3, 19), rng.randint(105, 990) / 100, rng.choice((20, 50, 100))
    a, b, speed1, speed2 = rng.randint(10, 90), rng.randint(10, 90), rng.randint(5, 30), rng.randint(5, 30)
    return rng.choice((
        f"A shop sells {item} for ${price:.2f} each. Sam buys {n} of them and pays with a ${paid} bill. "
        "How much change does he get? Show your reasoning step by step.",
        f"A train travels {a} km at {speed1} km/h and then {b} km at {speed2} km/h. What is its average speed "
        "for the whole trip? Explain each step.",
        f"A recipe for {n} people needs {a * 10} grams of flour. How much flour is needed for {n + b % 7 + 1} "
        "people? Show the calculation.",
        f"What is {a}% of {b * 12}? Then add {n} to the result. Explain each step.",
    ))


@functools.cache
def _stdlib_functions() -> tuple[tuple[str, str, str, str], ...]:
    """(name, args, first docstring line, source) of documented top-level functions, 4-30 lines."""
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        lines = _SOURCE_LINES.findall(source)
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and not node.name.startswith("_") and 4 <= node.end_lineno - node.lineno <= 30:
                args = ", ".join(a.arg for a in node.args.args)
                out.append((node.name, args, doc.strip().splitlines()[0], _segment(lines, node)))
    return tuple(out)


# a source's lines as the parser splits them (\r\n, \r or \n; not str.splitlines' form feeds)
_SOURCE_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _segment(lines: list[str], node: ast.stmt) -> str:
    """ast.get_source_segment(source, node) from the source's lines, split once: that function
    splits the whole file again for every node (half a minute over the standard library)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    tail = lines[last].encode()[: node.end_col_offset].decode()
    return "".join([head, *lines[first + 1 : last], tail])


@functools.cache
def _passages() -> tuple[str, ...]:
    """Prose paragraphs (300-1200 characters, mostly letters, no licence text) from the documentation
    shipped with packages and the standard library's module docstrings."""
    docs = sorted(p for base in site.getsitepackages() for p in Path(base).glob("*/*")
                  if (p.suffix in (".md", ".rst", ".txt") or p.name == "METADATA") and p.is_file())
    texts = [_read(path) for path in docs]
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            texts.append(ast.get_docstring(ast.parse(_read(path))) or "")
        except SyntaxError:
            continue
    out = []
    for text in texts:
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            letters = sum(c.isalpha() or c == " " for c in para)
            if 300 <= len(para) <= 1200 and letters > 0.9 * len(para) and not _LICENCE.search(para):
                out.append(para)
    return tuple(out)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""
