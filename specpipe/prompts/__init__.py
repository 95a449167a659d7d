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
    prompts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [p for p in prompts if not categories or p["category"] in categories]
