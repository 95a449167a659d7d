"""`specpipe check <the same overrides as generate>`: the compatibility table, no weights loaded.

Exits 2 when a check refuses the configuration, 0 otherwise.
"""

from __future__ import annotations

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from specpipe.build import config_checks
from specpipe.checks.validate import check_prompts

STYLE = {"ok": "green", "warn": "yellow", "refuse": "bold red", "n/a": "dim"}


def run(cfg: DictConfig, prompts: list[str] | None = None) -> int:
    """prompts: the command line's prompts, as generate takes them (checked the same way)."""
    # judged by the zoo entry where a model is not fetched yet: `check` never downloads
    checks = [*config_checks(cfg, fetch=False), *([check_prompts(prompts)] if prompts else [])]
    table = Table(title=f"specpipe check: {cfg.model.name}")
    for column in ("check", "status", "why", "how to fix"):
        table.add_column(column)
    for check in checks:
        style = STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status}[/{style}]", check.why, check.fix)
    Console().print(table)
    return 2 if any(c.status == "refuse" for c in checks) else 0
