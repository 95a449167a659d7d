"""Writes the built-in prompt set `spec-bench` (specpipe/prompts/spec-bench.jsonl) from Spec-Bench.

    git clone https://github.com/hemingkx/Spec-Bench
    python benchmarks/spec_bench_prompts.py Spec-Bench/data/spec_bench/question.jsonl

Spec-Bench (Xia et al., ACL 2024 Findings; Apache-2.0) holds 480 questions: MT-bench's 80, each
two turns, in MT-bench's eight categories, then 80 single-turn questions each of translation,
summarization, qa, math_reasoning and rag. Kept: each question's first turn, as one user
message, under the category Spec-Bench's own evaluation/speed.py reports it in (MT-bench's eight
are its `mt_bench`), with the id `spec-bench-<question_id>` so a prompt can be found in the
source. Dropped: second turns (a bench prompt is a request, not a replayed conversation) and
reference answers. No `max_new_tokens` is written: the command's applies (Spec-Bench's own runs
generate up to 1024). The set's attribution is specpipe/prompts/spec-bench.NOTICE.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "specpipe" / "prompts" / "spec-bench.jsonl"
# what Spec-Bench's evaluation/speed.py counts as its multi-turn category `mt_bench`
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
PER_CATEGORY = 80


def convert(question: dict) -> dict:
    """One Spec-Bench question as a specpipe prompt: its first turn, its reported category."""
    category = "mt_bench" if question["category"] in MT_BENCH else question["category"]
    return {"id": f"spec-bench-{question['question_id']}", "category": category,
            "messages": [{"role": "user", "content": question["turns"][0]}]}


def check(prompts: list[dict]) -> None:
    """The source is the file this set describes: six categories of 80 (a moved or edited file
    would otherwise ship quietly under the same name)."""
    counts = Counter(p["category"] for p in prompts)
    if counts != {c: PER_CATEGORY for c in CATEGORIES}:
        raise SystemExit(f"expected {PER_CATEGORY} questions in each of {', '.join(CATEGORIES)}; "
                         f"the file has {dict(counts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", type=Path, help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    lines = args.questions.read_text(encoding="utf-8").splitlines()
    prompts = [convert(json.loads(line)) for line in lines if line.strip()]
    check(prompts)
    # UTF-8 as written (German in the translation prompts, typographic quotes elsewhere): readable in a diff
    args.out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    print(f"{args.out}: {len(prompts)} prompts, {PER_CATEGORY} in each of {', '.join(CATEGORIES)}")


if __name__ == "__main__":
    main()
