"""Built-in prompt sets. `dev`: 50 prompts in six categories (code, code-edit, chat, summarize,
math, multiturn), one JSON object a line: {"id", "category", "messages", "max_new_tokens"}."""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.errors import SpecpipeError

BUILTIN = {"dev": Path(__file__).parent / "dev.jsonl"}


def load_prompts(name_or_path: str, categories: list[str] | None = None) -> list[dict]:
    path = BUILTIN.get(name_or_path, Path(name_or_path))
    if not path.is_file():
        raise SpecpipeError(
            f"Prompt set '{name_or_path}' was not found. Use a built-in set ({', '.join(BUILTIN)}) "
            "or a JSONL file of {\"id\", \"category\", \"messages\"} objects."
        )
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    prompts = [_record(line, i, path) for i, line in enumerate(lines)]
    return [p for p in prompts if not categories or p["category"] in categories]


def _record(line: str, index: int, path: Path) -> dict:
    """One prompt: {"id", "category", "messages"} (a bare {"prompt": text} is accepted too)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise SpecpipeError(f"{path}, line {index + 1}, is not JSON ({err.msg}). One JSON object a line.") from None
    if not isinstance(record, dict):
        raise SpecpipeError(f"{path}, line {index + 1}, is not a JSON object.")
    if isinstance(record.get("prompt"), str) and "messages" not in record:
        record["messages"] = [{"role": "user", "content": record["prompt"]}]
    messages = record.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and "content" in m for m in messages)):
        raise SpecpipeError(f"{path}, line {index + 1}, needs \"messages\": [{{\"role\": \"user\", "
                            "\"content\": ...}}, ...] (or \"prompt\": text).")
    record.setdefault("id", f"prompt-{index + 1}")
    record.setdefault("category", "default")
    return record
