"""`specpipe check <the same overrides as generate>`: the compatibility table, no weights loaded.

Exits 2 when a check refuses the configuration, 0 otherwise.
"""

from __future__ import annotations

from omegaconf import DictConfig
from rich.table import Table

from specpipe.build import config_checks
from specpipe.checks.result import Check
from specpipe.checks.validate import check_prompts
from specpipe.limits import fit_slots
from specpipe.markup import esc
from specpipe.settings import Settings, fetched, resolve
from specpipe.ui.tables import show

STYLE = {"ok": "green", "warn": "yellow", "refuse": "bold red", "n/a": "dim"}


def prompt_room(s: Settings, prompts: list[str]) -> Check:
    """Whether each prompt leaves room for output, counted as generate counts it (the chat template
    through `decode.text.encode`, the bound of `Budget.fit`: n tokens fit a context of n), from
    the tokenizer and config alone: generate asks this before any weights load, and check shows it."""
    from specpipe.decode.text import encode
    from specpipe.models.loader import load_tokenizer

    if not _on_disk(s):  # `check` never downloads
        return Check("context", "n/a", f"{s.model} is not fetched yet: its prompts are counted once it is")
    tokenizer = load_tokenizer(s.source)
    positions = getattr(s.target_config, "max_position_embeddings", None)
    limit = s.slots if s.engine != "hf" else positions  # hf's cache grows up to the positions
    if not isinstance(limit, int):
        return Check("context", "n/a", "the target's context is unknown")
    chat = bool(getattr(tokenizer, "chat_template", None)) if s.chat is None else bool(s.chat)
    lengths = [len(encode(tokenizer, p, chat)) for p in prompts]
    after = " after the chat template" if chat else ""
    full = [f"prompt {i + 1} ({n} tokens{after})" for i, n in enumerate(lengths) if n > limit]
    if full:
        return Check("context", "refuse", f"{', '.join(full)} leave no room for output in the {limit}-token context "
                     f"(cache_len={s.cache_len}, the model's positions {positions})",
                     "shorten the prompt, or raise cache_len= up to the model's positions")
    return Check("context", "ok", f"the longest prompt is {max(lengths)} tokens{after} of the {limit}-token context")


def capped_cache(s: Settings) -> str | None:
    """What a run says when cache_len is above the target's positions (the native engine allocates
    no more than them: limits.cache_slots), from its config alone; None where nothing is capped."""
    if s.engine == "hf" or not _on_disk(s):
        return None
    slots = s.slots
    if slots >= s.cache_len:
        return None
    return (f"cache_len={s.cache_len} is more than the {slots} positions {s.model} was trained for: its KV "
            f"cache holds {slots} tokens a sequence (pass cache_len={slots} or less to say so yourself)")


def _on_disk(s: Settings) -> bool:
    """Whether the target's files are here (its config then read from them, not from the zoo)."""
    return s.source.is_dense_cached or fetched(s.source)


def run(cfg: DictConfig, prompts: list[str] | None = None) -> int:
    """prompts: the command line's prompts, as generate takes them (checked the same way)."""
    lowered = fit_slots(cfg, len(prompts), "batch") if prompts else None  # as generate runs them
    # judged by the zoo entry where a model is not fetched yet: `check` never downloads
    settings = resolve(cfg, fetch=False)
    checks = [*config_checks(cfg, settings), *([check_prompts(prompts)] if prompts else [])]
    if prompts and not any(c.status == "refuse" for c in checks):
        checks.append(prompt_room(settings, prompts))
    if lowered:
        checks.append(Check("batch size", "ok", lowered))
    table = Table(title=f"specpipe check: {esc(settings.model)}")
    for column in ("check", "status", "why", "how to fix"):
        table.add_column(column)
    for check in checks:
        style = STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status}[/{style}]", esc(check.why), esc(check.fix))
    show(table)
    return 2 if any(c.status == "refuse" for c in checks) else 0
