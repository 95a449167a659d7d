"""User-facing errors.

A `SpecpipeError` is bad input or an impossible request: the CLI prints its message (one
paragraph: what is wrong, how to fix it) and exits with code 2, without a traceback. Anything
else that escapes is a bug in specpipe.
"""


from dataclasses import dataclass


class SpecpipeError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""

    exit_code = 2


@dataclass(frozen=True)
class Refusal:
    """A setting a rule refuses: why, and how to fix it. `specpipe check` reports the two (its
    why and how-to-fix columns); the run raises the sentence they make (`str`), so the check and
    the run say the same thing, from the same rule. Each rule is one function returning one (or
    None), in the module the rule concerns (the engine's, a model's adapters, its precision)."""

    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.why}. {self.fix[:1].upper()}{self.fix[1:]}."


def refuse(refusal: Refusal | None) -> None:
    """Raise a rule's refusal as the run's error (the CLI prints it and exits 2)."""
    if refusal is not None:
        raise SpecpipeError(str(refusal))


def report(err: SpecpipeError) -> int:
    """Print a user error as the CLI does (one paragraph, no traceback); its exit code."""
    from rich.console import Console  # here, not at import: errors is a leaf every module may import

    from specpipe.markup import esc  # the message quotes user text: `[/x]` in a path is no markup tag

    Console(stderr=True).print(f"[bold red]error:[/bold red] {esc(err)}", highlight=False)
    return err.exit_code
