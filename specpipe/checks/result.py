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

    @classmethod
    def refused(cls, name: str, refusal) -> "Check":
        """A rule's refusal (`engine.Refusal`: why, and how to fix it) as this check's row: the
        words the run raises, in the why and how-to-fix columns."""
        return cls(name, "refuse", refusal.why, refusal.fix)


def refuse_if_any(checks: list[Check]) -> None:
    for check in checks:
        if check.status == "refuse":
            fix = f" Fix: {check.fix}." if check.fix else ""
            raise SpecpipeError(f"{check.name}: {check.why.rstrip('.')}.{fix}")
