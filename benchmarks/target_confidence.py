"""Does the target's own confidence on a request's first tokens say whether a draft model's
drafts will pay? (The guard could read it for free: the target computes those logits anyway.)

Per prompt: the target's greedy answer, the mean top probability of its softmax over the first
1, 4, 8 and 16 answer tokens, and how often the draft's argmax agrees with the answer over all
of it (teacher-forced: one forward of each model over prompt + answer). fp32, on the CPU.

    python benchmarks/target_confidence.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

Default prompts: the first of each category of the dev and held-aside sets, and every code
prompt of the dev set. Prints a markdown table, sorted by agreement.
"""

from __future__ import annotations

import argparse

import torch

from specpipe.decode.text import encode
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.prompts import load_prompts

OPENINGS = (1, 4, 8, 16)  # answer tokens the target's confidence is averaged over


def default_prompts() -> list[dict]:
    """The first prompt of each category of both sets, then the dev set's other code prompts."""
    chosen, seen = [], set()
    for record in load_prompts("dev") + load_prompts("held-aside"):
        if record["category"] not in seen:
            seen.add(record["category"])
            chosen.append(record)
    return chosen + [r for r in load_prompts("dev", ["code"]) if r not in chosen]


@torch.no_grad()
def measure(target, draft, tokenizer, record: dict, tokens: int) -> dict:
    ids = encode(tokenizer, record["messages"], bool(tokenizer.chat_template))
    out = target.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                          output_scores=True, return_dict_in_generate=True)
    answer = out.sequences[0, len(ids):]  # [n]
    top = torch.stack([s[0].float().softmax(-1).max() for s in out.scores])  # [n]
    drafted = draft(out.sequences).logits[0, len(ids) - 1:-1].argmax(-1)  # [n]: the draft's guess at each answer token
    row = {"id": record["id"], "agreement": (drafted == answer).float().mean().item()}
    row.update({f"top{k}": top[:k].mean().item() for k in OPENINGS})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--tokens", type=int, default=48, help="answer tokens per prompt")
    args = parser.parse_args()
    source = resolve(args.target)
    target, draft = load_model(source), load_model(resolve(args.draft))
    tokenizer = load_tokenizer(source)
    rows = [measure(target, draft, tokenizer, record, args.tokens) for record in default_prompts()]
    print("| prompt | draft agrees | " + " | ".join(f"top-p, first {k}" for k in OPENINGS) + " |")
    print("|---|---|" + "---|" * len(OPENINGS))
    for row in sorted(rows, key=lambda r: r["agreement"]):
        print(f"| {row['id']} | {row['agreement']:.2f} | " + " | ".join(f"{row[f'top{k}']:.2f}" for k in OPENINGS) + " |")


if __name__ == "__main__":
    main()
