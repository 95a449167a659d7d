"""Every result table goes to stdout through `show`, so no width cuts what it says.

- a pipe or a file (not a terminal): the table at its natural width, whatever COLUMNS says (rich
  would cut it to 80 columns, every cell of a wide table ending in "…");
- a terminal narrower than the table's minimum width (each column at its longest word): each
  row as "column: value" lines, wrapped, so a refused value (`gamma=…`) and the verdict are read
  whole on a 40-column terminal, and nothing is blank on a 5-column one;
- otherwise the table as rich draws it.

Not here: what the tables hold (commands/, bench/table.py).
"""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def show(table: RenderableType, console: Console | None = None) -> None:
    console = console or Console()
    if isinstance(table, Group):  # tables one after the other (bench's two): each shown so
        for part in table.renderables:
            show(part, console)
        return
    if not isinstance(table, Table):
        console.print(table)
        return
    needed = Measurement.get(console, console.options.update_width(10_000), table)
    if not console.is_terminal:
        # rich caps print(width=) at the console's width: a console as wide as the table instead
        Console(file=console.file, width=max(console.width, needed.maximum)).print(table, crop=False)
    elif console.width < needed.minimum:
        _records(table, console)
    else:
        console.print(table)


def _records(table: Table, console: Console) -> None:
    """The table as one block of `column: value` lines per row (styles kept, nothing cut)."""
    if table.title:
        console.print(table.title if isinstance(table.title, Text) else Text.from_markup(str(table.title)),
                      style="bold", soft_wrap=False)
    names = [column.header if isinstance(column.header, str) else str(column.header) for column in table.columns]
    for row in range(table.row_count):
        console.print()
        for name, column in zip(names, table.columns):
            cell = list(column.cells)[row]
            value = Text.from_markup(cell) if isinstance(cell, str) else cell
            if isinstance(value, Text) and not value.plain.strip():
                continue
            line = Text.assemble((f"{Text.from_markup(name).plain}: ", "bold"), value) if isinstance(value, Text) else value
            console.print(line, overflow="fold")
    if table.caption:
        console.print()
        console.print(table.caption if isinstance(table.caption, Text) else Text.from_markup(str(table.caption)))
