"""Prompt sets: the built-in ones and the user's JSONL files, read through one validator.

`dev`: 50 prompts in six categories (code, code-edit, chat, summarize, math, multiturn), what
benchmarks measure. `held-aside`: 16 prompts unlike the dev set and the training requests
(creative writing, other natural languages, long chats, structured output such as JSON, tables,
CSV and YAML), where trained heads and lookup drafts find little: recipes are judged there too.
`spec-bench`: the first turns of Spec-Bench's 480 questions (Apache-2.0, hemingkx/Spec-Bench; see
spec-bench.NOTICE and benchmarks/spec_bench_prompts.py), 80 in each of mt_bench, translation,
summarization, qa, math_reasoning and rag: what papers report on, so a result there is reported,
never chosen or tuned on.
Sets join with `+` (`prompts=dev+held-aside`). `requests` to `requests-6`: 280 training requests each in the first five
(train/requests.py), written apart from `dev`: a head never learns the prompts it is measured on. A file
holds one JSON object a line: {"id", "category", "messages": [{"role", "content"}, ...],
"max_new_tokens"} (only "messages" is required; a bare {"prompt": text} is one user message; any
other key is refused by name rather than ignored).
Blank lines are skipped. Every reader of a prompt file (bench's `prompts=`, train's
`distill_prompts=`) goes through `load_prompts`, so a bad file is refused the same way
everywhere: with the file, the physical line number (1-based, blank lines counted) and the field.
Whether a prompt fits the model's context is not checked here (that needs the tokenizer):
see `context.Budget.fit`.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from specpipe.errors import SpecpipeError

_HERE = Path(__file__).parent
BUILTIN = {"dev": _HERE / "dev.jsonl", "held-aside": _HERE / "held-aside.jsonl",
           # the banks of training requests (train/requests.py)
           "requests": _HERE / "requests.jsonl", "requests-2": _HERE / "requests-2.jsonl",
           "requests-3": _HERE / "requests-3.jsonl", "requests-4": _HERE / "requests-4.jsonl",
           "requests-5": _HERE / "requests-5.jsonl", "requests-6": _HERE / "requests-6.jsonl",
           # the field's benchmark, for reporting only (its source and license: spec-bench.NOTICE)
           "spec-bench": _HERE / "spec-bench.jsonl"}
EXAMPLE = '{"id": "p1", "category": "chat", "messages": [{"role": "user", "content": "..."}]}'
# byte-order marks of encodings that are not UTF-8: named, since "byte 0xff" alone is a riddle
_OTHER_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
               (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def load_prompts(name_or_path, categories: list[str] | None = None) -> list[dict]:
    """The prompts of a built-in set or a JSONL file (those in `categories`, if given), each with
    "id", "category" and "messages" filled in; a SpecpipeError naming the line of a bad record."""
    if isinstance(name_or_path, str) and "+" in name_or_path and not Path(name_or_path).expanduser().is_file():
        joined = [p for part in name_or_path.split("+") for p in load_prompts(part.strip(), categories)]
        _unique_ids([(i, p) for i, p in enumerate(joined, 1)], Path(name_or_path))
        return joined
    builtin = BUILTIN.get(name_or_path) if isinstance(name_or_path, str) else None
    path = builtin or Path(str(name_or_path)).expanduser()
    if not path.is_file():
        raise SpecpipeError(
            f"Prompt set '{name_or_path}' was not found. Use a built-in set ({', '.join(BUILTIN)}) "
            f"or a JSONL file of one JSON object a line, e.g. {EXAMPLE}."
        )
    numbered = [(number, _record(line, number, path)) for number, line in enumerate(_lines(path), 1) if line.strip()]
    if not numbered:
        raise SpecpipeError(f"{path} has no prompts (it is empty or blank). Write one JSON object a line, "
                            f"e.g. {EXAMPLE}.")
    _unique_ids(numbered, path)
    return [p for _, p in numbered if not categories or p["category"] in categories]


def _lines(path: Path) -> list[str]:
    """The file's physical lines as UTF-8 text (a leading UTF-8 BOM dropped: editors write one)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SpecpipeError(f"{path} cannot be read ({err.strerror}). Check the path and its permissions.") from None
    for bom, name in _OTHER_BOMS:
        if data.startswith(bom):
            raise SpecpipeError(f"{path}, line 1: the file is {name} text, not UTF-8. Save it as UTF-8 "
                                "(JSON Lines files are UTF-8).")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise SpecpipeError(
            f"{path}, line {line}, column {column}: byte 0x{data[err.start]:02x} is not UTF-8 text (is the file "
            "Latin-1 or Windows-1252?). Save it as UTF-8, or write non-ASCII characters as \\u escapes."
        ) from None
    # split on "\n" only: str.splitlines also breaks at U+2028, form feeds and the like, which JSON
    # strings may hold unescaped, and which would shift every later line number
    return text.split("\n")


RECORD_KEYS = {"id", "category", "messages", "prompt", "max_new_tokens"}


def _record(line: str, number: int, path: Path) -> dict:
    """One line's record, validated field by field; "messages" filled in from a bare "prompt"."""
    where = f"{path}, line {number}"
    record = _json(line, where)
    if not isinstance(record, dict):
        raise SpecpipeError(f"{where}: the line is a JSON {_kind(record)}, not an object. Write one JSON "
                            f"object a line, e.g. {EXAMPLE}.")
    unknown = sorted(set(record) - RECORD_KEYS)
    if unknown:  # else silently ignored, while "max_new_tokens" beside it is honoured
        raise SpecpipeError(f"{where}: the record has the key \"{unknown[0]}\", which a prompt record does not take "
                            f"(its keys: {', '.join(sorted(RECORD_KEYS))}); settings such as temperature are the "
                            "command's (temperature=...). Remove it, or fix its spelling.")
    if "prompt" in record and "messages" in record:
        raise SpecpipeError(f"{where}: the record has both \"prompt\" and \"messages\"; keep one of them.")
    if "prompt" in record:
        record["messages"] = [{"role": "user", "content": _text(record["prompt"], where, '"prompt"')}]
    elif "messages" in record:
        _messages(record["messages"], where)
    else:
        raise SpecpipeError(f"{where}: the record needs \"messages\": [{{\"role\": \"user\", \"content\": ...}}, "
                            f"...] (or \"prompt\": text). Got the keys {sorted(record)}.")
    if not any(m["content"].strip() for m in record["messages"]):
        raise SpecpipeError(f"{where}: the prompt has no text (every \"content\" is empty). Write the request "
                            "in it, or delete the line.")
    for key in ("id", "category"):
        if key in record:
            _name(record[key], where, f'"{key}"')
    if "max_new_tokens" in record:
        _max_new_tokens(record["max_new_tokens"], where)
    record.setdefault("id", f"prompt-{number}")  # named by its line, so it can be found
    record.setdefault("category", "default")
    return record


def _json(line: str, where: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise SpecpipeError(f"{where}, column {err.colno}: not JSON ({err.msg}). Write one JSON object a line, "
                            f"e.g. {EXAMPLE}.") from None
    except (ValueError, RecursionError) as err:  # an integer of over 4300 digits; nesting past the stack
        why = str(err).split(";")[0]  # not Python's advice on raising its digit limit
        raise SpecpipeError(f"{where}: the JSON cannot be read ({why}). Write one JSON object a line, "
                            f"e.g. {EXAMPLE}.") from None


def _messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else f"a JSON {_kind(messages)}"
        raise SpecpipeError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} "
                            f"objects, e.g. [{{\"role\": \"user\", \"content\": \"...\"}}]; got {got}.")
    for i, message in enumerate(messages):
        field = f'"messages"[{i}]'
        if not isinstance(message, dict):
            raise SpecpipeError(f"{where}: {field} must be an object {{\"role\": \"user\", \"content\": \"...\"}}; "
                                f"got a JSON {_kind(message)}.")
        for key in ("role", "content"):
            if key not in message:
                raise SpecpipeError(f"{where}: {field} has no \"{key}\"; each message is {{\"role\": \"user\", "
                                    "\"content\": \"...\"}.")
        _name(message["role"], where, f'{field}."role"')
        _text(message["content"], where, f'{field}."content"')


def _text(value, where: str, field: str) -> str:
    """A prompt's text: a string the tokenizer can encode."""
    if not isinstance(value, str):
        parts = " (a list of content parts is not supported: join their text into one string)" \
            if isinstance(value, list) else ""
        raise SpecpipeError(f"{where}: {field} must be a string; got a JSON {_kind(value)}{parts}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800": no tokenizer takes it
        raise SpecpipeError(f"{where}: {field} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
                            "its pair), which is not text. Fix or drop that escape.") from None
    return value


def _name(value, where: str, field: str) -> None:
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else f"a JSON {_kind(value)}"
        hint = f' (write "{value}")' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        raise SpecpipeError(f"{where}: {field} must be a non-empty string; got {got}{hint}.")


def _max_new_tokens(value, where: str) -> None:
    # bool is an int in Python, but `true` is no token count
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        got = f"the {_kind(value)} {json.dumps(value)}"
        raise SpecpipeError(f"{where}: \"max_new_tokens\" must be a whole number of at least 1; got {got}. "
                            "Drop the key to use the command's max_new_tokens=.")


def _unique_ids(numbered: list[tuple[int, dict]], path: Path) -> None:
    """Results are keyed by id: two prompts with one id would be reported as one."""
    seen: dict[str, int] = {}
    for number, prompt in numbered:
        if prompt["id"] in seen:
            raise SpecpipeError(f"{path}, line {number}: id \"{prompt['id']}\" is also the id on line "
                                f"{seen[prompt['id']]}. Give each prompt its own id.")
        seen[prompt["id"]] = number


def _kind(value) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)
