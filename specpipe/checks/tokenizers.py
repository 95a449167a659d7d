"""A second model's tokenizer against the target's: the same, translated, or refused."""

from __future__ import annotations

from specpipe.checks.result import Check
from specpipe.errors import SpecpipeError
from specpipe.settings import Settings


def same_tokenizer_problems(target_tok, draft_tok) -> list[str]:
    """How two tokenizers differ ([]: the same ids mean the same text)."""
    problems = []
    if len(target_tok) != len(draft_tok):
        problems.append(f"vocabulary sizes differ ({len(target_tok)} vs {len(draft_tok)})")
    elif target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append("the same ids map to different token strings")
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        problems.append(f"EOS ids differ ({target_tok.eos_token_id} vs {draft_tok.eos_token_id})")
    return problems


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft model must tokenize exactly like the target: same vocabulary, same specials."""
    problems = same_tokenizer_problems(target_tok, draft_tok)
    if problems:
        raise SpecpipeError(
            f"The draft model '{draft_name}' does not share the target '{target_name}''s tokenizer: "
            f"{'; '.join(problems)}. Its token ids would mean different text to the target. Pick a "
            "draft from the target's family (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b), or "
            "a proposer that needs no second model: proposer=twin."
        )


def check_tokenizer(s: Settings, target_tokenizer_loader, draft_tokenizer_loader) -> Check:
    """A second model's tokenizer against the target's: equal where the proposer declares `same`;
    where it declares `any`, a different one is translated and the proposer reports how."""
    declaration, target = s.declaration, s.model
    if declaration.tokenizer == "target":
        return Check("tokenizer", "ok", f"proposer={declaration.name} uses the target's own tokenizer")
    from specpipe.models import zoo

    draft = s.draft.model
    pair = [zoo.ZOO.get(str(name)) for name in (target, draft)]
    known = None not in pair
    if known and pair[0].tokenizer_family == pair[1].tokenizer_family:
        return Check("tokenizer", "ok", f"draft and target share the {pair[0].tokenizer_family} tokenizer (zoo)")
    if declaration.tokenizer == "same" and known:  # known to differ without a download
        return Check("tokenizer", "refuse", f"The draft model '{draft}' does not share the target "
                     f"'{target}''s tokenizer ({pair[1].tokenizer_family} vs {pair[0].tokenizer_family}): its "
                     "token ids would mean different text to the target", "pick a draft from the target's family")
    target_tok, draft_tok = target_tokenizer_loader(), draft_tokenizer_loader()
    if target_tok is not None and draft_tok is not None and same_tokenizer_problems(target_tok, draft_tok) == []:
        return Check("tokenizer", "ok", "draft and target share vocabulary, token strings and EOS")
    if target_tok is None or draft_tok is None:  # not fetched (export): compared when they are
        if known and declaration.vocabulary is not None:  # the zoo says they differ: translated
            return declaration.vocabulary(None, None, target, draft, s.temperature)
        return Check("tokenizer", "ok", f"the tokenizers of '{draft}' and '{target}' are compared once both "
                     "are fetched (specpipe check, generate)")
    if declaration.tokenizer == "same" or declaration.vocabulary is None:
        try:
            check_same_tokenizer(target_tok, draft_tok, target, draft)
        except SpecpipeError as err:
            return Check("tokenizer", "refuse", str(err), "pick a draft from the target's family")
    return declaration.vocabulary(target_tok, draft_tok, target, draft, s.temperature)
