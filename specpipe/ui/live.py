"""The live view of `specpipe generate`: streamed text above, step metrics below.

The estimated speedup during generation assumes a verify forward costs what a plain step
costs (τ × verify time / step time); the measured speedup replaces it once the plain target
has run on the same prompt. While the guard holds the request at γ = 0 (its speculation measured
slower than plain steps, or a plain probe), the γ column says so.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specpipe.metrics import Stats
from specpipe.pipeline import Generation, Pipeline, collect


def estimated_speedup(stats: Stats) -> float:
    return stats.mean_accepted_length * stats.verify_s / stats.decode_s if stats.decode_s else 0.0


def metrics_table(stats: Stats, gamma: int | None, held: bool = False) -> Table:
    table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    for column in ("tokens/s", "acceptance", "mean accepted length τ", "γ", "est. speedup"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{stats.tokens_per_s:.1f}",
        f"{stats.acceptance_rate:.0%}" if stats.drafted else "-",
        f"{stats.mean_accepted_length:.2f}",
        gamma_text(gamma, held),
        f"{estimated_speedup(stats):.2f}x" if stats.drafted else "-",
    )
    return table


def gamma_text(gamma: int | None, held: bool) -> str:
    if held:
        return "[yellow]0 · speculation paused (guard)[/yellow]"
    return "-" if gamma is None else str(gamma)


def stream(pipeline: Pipeline, prompt, console: Console, title: str, **kwargs) -> Generation:
    """Run one speculative generation, redrawing text and metrics after every step."""
    with Live(console=console, refresh_per_second=8) as live:
        def shown(events):
            text = ""
            for event in events:
                text += event.text
                live.update(Group(Panel(Text(text), title=title), metrics_table(event.stats, event.gamma, event.held)))
                yield event

        generation = collect(shown(pipeline.generate(prompt, **kwargs)))
    console.print()
    return generation


def summary(spec: Stats, base: Stats | None, equal: bool | None, lossy: bool) -> Group:
    """The measured comparison, then one line of acceptance details."""
    details = (
        f"acceptance {spec.acceptance_rate:.0%} · τ {spec.mean_accepted_length:.2f} · per-position "
        + " ".join(f"{a:.2f}" for a in spec.per_position_acceptance)
        + ("" if equal is None else f" · greedy output identical to plain: {'yes' if equal else 'NO'}")
        + (" · LOSSY verifier: output differs from the target's distribution" if lossy else "")
    )
    return Group(summary_table(spec, base), Text(details))


def summary_table(spec: Stats, base: Stats | None) -> Table:
    table = Table(title="speculative vs plain target (same prompt, same process)")
    table.add_column("")
    table.add_column("tokens/s", justify="right")
    table.add_column("new tokens", justify="right")
    table.add_row("speculative", f"{spec.tokens_per_s:.2f}", str(spec.emitted))
    if base is not None:
        table.add_row("plain target", f"{base.tokens_per_s:.2f}", str(base.emitted))
        table.add_row("[bold]speedup[/bold]", f"[bold]{spec.tokens_per_s / base.tokens_per_s:.2f}x[/bold]", "")
    return table
