"""Compatibility checks that refuse a pipeline before any weights load.

Each check raises `SpecpipeError` with what is wrong and how to fix it.
"""

from __future__ import annotations

from specpipe.errors import SpecpipeError


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft model must tokenize exactly like the target: same vocabulary, same specials."""
    problems = []
    if len(target_tok) != len(draft_tok):
        problems.append(f"vocabulary sizes differ ({len(target_tok)} vs {len(draft_tok)})")
    elif target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append("the same ids map to different token strings")
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        problems.append(f"EOS ids differ ({target_tok.eos_token_id} vs {draft_tok.eos_token_id})")
    if problems:
        raise SpecpipeError(
            f"The draft model '{draft_name}' does not share the target '{target_name}''s tokenizer: "
            f"{'; '.join(problems)}. Its token ids would mean different text to the target. Pick a "
            "draft from the target's family (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b), or "
            "a proposer that needs no second model: proposer=twin."
        )
