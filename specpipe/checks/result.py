"""`Check`, the value every check returns, and the one way a refusal becomes an error."""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | refuse | n/a
    why: str
    fix: str = ""
    translated: bool = False  # tokenizer check: the draft's tokens are translated (it decodes one sequence at a time)


def refuse_if_any(checks: list[Check]) -> None:
    for check in checks:
        if check.status == "refuse":
            fix = f" Fix: {check.fix}." if check.fix else ""
            raise SpecpipeError(f"{check.name}: {check.why.rstrip('.')}.{fix}")
