"""User-facing errors.

A `SpecpipeError` is bad input or an impossible request: the CLI prints its message (one
paragraph: what is wrong, how to fix it) and exits with code 2, without a traceback. Anything
else that escapes is a bug in specpipe.
"""


class SpecpipeError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""

    exit_code = 2


def report(err: SpecpipeError) -> int:
    """Print a user error as the CLI does (one paragraph, no traceback); its exit code."""
    from rich.console import Console  # here, not at import: errors is a leaf every module may import

    from specpipe.markup import esc  # the message quotes user text: `[/x]` in a path is no markup tag

    Console(stderr=True).print(f"[bold red]error:[/bold red] {esc(err)}", highlight=False)
    return err.exit_code
