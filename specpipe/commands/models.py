"""`specpipe models` (list the zoo, what is cached and what is damaged) and `specpipe models fetch NAME`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from specpipe.errors import SpecpipeError
from specpipe.markup import esc
from specpipe.ui.tables import show
from specpipe.models import zoo

USAGE = "usage: specpipe models            list the built-in models and what is cached\n" \
        "       specpipe models fetch NAME fetch one (sha256-verified, cached)"


def run(args: list[str]) -> int:
    if not args:
        _list()
        return 0
    if args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] == "fetch" and len(args) == 2:
        path = zoo.fetch(args[1])
        Console().print(f"{esc(args[1])}: [green]cached[/green] at {esc(path)}")
        return 0
    raise SpecpipeError(f"`specpipe models {' '.join(args)}` is not a models command. {USAGE}")


def _list() -> None:
    table = Table(title=f"specpipe model zoo (cache: {esc(zoo.cache_root())})")
    for column in ("name", "model", "size", "cached", "dense copy"):
        table.add_column(column)
    for row in zoo.status():
        table.add_row(row["name"], row["description"], f"{row['size_bytes'] / 1e6:.0f} MB",
                      _cached(row), _dense(row))
    show(table)
    Console().print(_families())


def _families() -> str:
    """The architectures the native engine runs (any other runs on engine=hf)."""
    from specpipe.engine.native_model import FAMILIES

    return (f"native engine (engine=auto picks it for these; any other architecture runs on engine=hf): "
            f"{', '.join(FAMILIES)}")


def _cached(row: dict) -> str:
    if row["damaged"]:
        return f"[red]damaged[/red]: {esc(row['damaged'])}; fetched again on next use"
    return "[green]yes[/green]" if row["cached"] else f"no (specpipe models fetch {row['name']})"


def _dense(row: dict) -> str:
    if row["dense_damaged"]:
        return f"[red]damaged[/red]: {esc(row['dense_damaged'])}; rebuilt on next load"
    return "[green]yes[/green]" if row["dense"] else "no (built on first load)"
