"""User text on its way to rich: escaped, so it prints as typed.

rich reads `[word]` and `[/word]` in a printed string as style tags: a prompt id `[/b]`, a path
`[bold]notes.txt` or an error quoting either would lose those characters, or stop the printer
itself with a MarkupError (and the real message with it). Whatever did not come from specpipe's
own source (paths, prompts and their ids, model names, error and warning text, a check's why)
goes through `esc` wherever it meets markup: a `print`, a `status`, a table's title or cells.
"""

from __future__ import annotations

from rich.markup import escape


def esc(value) -> str:
    """`value` as text rich prints verbatim inside markup."""
    return escape(str(value))
