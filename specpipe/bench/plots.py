"""PNG plots of bench results (matplotlib, Agg backend: no display needed).

One run: speedup by category, per-position acceptance by category, and per-prompt speedup
against the mean γ that prompt ran at (a request load: γ and batch size over time). A sweep:
median speedup against γ, one line per proposer and controller, and speedup by category for
every job (request loads: throughput and P99 time per output token against concurrency).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from specpipe.bench.summary import OVERALL
from specpipe.errors import SpecpipeError
from specpipe.outputs import why


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SpecpipeError("plot=true needs matplotlib: pip install 'specpipe[plot]' (or matplotlib).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(payload: dict, folder: Path) -> list[Path]:
    plt = _pyplot()
    if "load" in payload:
        return [_plot_gamma_over_time(plt, payload, folder)]
    summary = payload["summary"]
    categories = list(summary)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    medians = [summary[c]["speedup"]["median"] for c in categories]
    errors = [[m - summary[c]["speedup"]["min"] for c, m in zip(categories, medians)],
              [summary[c]["speedup"]["max"] - m for c, m in zip(categories, medians)]]
    ax.bar(categories, medians, yerr=errors, capsize=4, color="tab:blue")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(ylabel="speedup over the plain target (median, min-max)", title=_title(payload))
    paths.append(_save(plt, fig, folder / "speedup_by_category.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for category in categories:
        rates = summary[category]["per_position_acceptance"]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=category)
    ax.set(xlabel="draft position", ylabel="P(accepted | drafted)", ylim=(0, 1.05), title=_title(payload))
    ax.legend(fontsize="small")
    paths.append(_save(plt, fig, folder / "per_position_acceptance.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for category in categories[:-1] if len(categories) > 1 else categories:
        prompts = [p for p in payload["prompts"] if category in (OVERALL, p["category"])]
        ax.scatter([_mean_gamma(p) for p in prompts], [p["speedup"] for p in prompts], label=category)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="mean γ of the prompt's steps", ylabel="speedup", title=_title(payload))
    ax.legend(fontsize="small")
    paths.append(_save(plt, fig, folder / "speedup_vs_gamma.png"))
    return paths


def plot_sweep(jobs: list[tuple[str, dict]], folder: Path) -> list[Path]:
    plt = _pyplot()
    loads = [p for _, p in jobs if "load" in p]
    if loads:
        return _plot_load_sweep(plt, loads, folder)
    lines = defaultdict(list)  # (proposer, controller) -> [(γ, median speedup)]
    for _, payload in jobs:
        strategy = payload["strategy"]
        lines[strategy["proposer"], strategy["controller"]].append(
            (strategy["gamma"], payload["summary"][OVERALL]["speedup"]["median"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    for (proposer, controller), points in sorted(lines.items()):
        points.sort()
        ax.plot([g for g, _ in points], [s for _, s in points], marker="o", label=f"{proposer} · {controller}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="γ (the fixed controller's; adaptive ones start there)", ylabel="median speedup",
           title="sweep: speedup against γ")
    ax.legend(fontsize="small")
    paths = [_save(plt, fig, folder / "sweep_speedup_vs_gamma.png")]

    categories = list(dict.fromkeys(c for _, p in jobs for c in p["summary"] if c != OVERALL))
    fig, ax = plt.subplots(figsize=(max(7, len(jobs) * 0.9), 4))
    width = 0.8 / max(len(categories), 1)
    for i, category in enumerate(categories):
        ax.bar([j + i * width for j in range(len(jobs))],
               [p["summary"].get(category, {}).get("speedup", {}).get("median", 0) for _, p in jobs],
               width, label=category)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(jobs))], [name for name, _ in jobs],
                  rotation=30, ha="right", fontsize="x-small")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(ylabel="median speedup", title="sweep: speedup by category")
    ax.legend(fontsize="small")
    paths.append(_save(plt, fig, folder / "sweep_speedup_by_category.png"))
    return paths


def _plot_load_sweep(plt, payloads: list[dict], folder: Path) -> list[Path]:
    """Request loads (`-m concurrency=1,2,4,8`): throughput and P99 TPOT against concurrency,
    one line per strategy and one for the plain target (and peers)."""
    lines = defaultdict(dict)  # label -> {concurrency: (tokens/s, P99 TPOT ms)}
    for payload in payloads:
        load, s = payload["load"], payload["strategy"]
        c = load["concurrency"]
        lines[f"{payload['model']} plain"][c] = (load["plain"]["tokens_per_s"], _p99(load["plain"]))
        lines[f"{payload['model']} {s['proposer']} · {s['controller']}"][c] = (
            load["speculative"]["tokens_per_s"], _p99(load["speculative"]))
        for name, peer in load["peers"].items():
            lines[f"{payload['model']} {name}"][c] = (peer["tokens_per_s"], None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, points in sorted(lines.items()):
        xs = sorted(points)
        left.plot(xs, [points[x][0] for x in xs], marker="o", label=label)
        if all(points[x][1] is not None for x in xs):
            right.plot(xs, [points[x][1] for x in xs], marker="o", label=label)
    left.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput")
    right.set(xlabel="concurrency", ylabel="P99 time per output token (ms)", title="tail latency")
    left.legend(fontsize="x-small")
    return [_save(plt, fig, folder / "load_vs_concurrency.png")]


def _p99(figures: dict) -> float | None:
    return figures["tpot_ms"]["p99"] if figures.get("tpot_ms") else None


def _plot_gamma_over_time(plt, payload: dict, folder: Path) -> Path:
    trace = payload["load"]["gamma_over_time"]  # [at_s, batch, γ] per step
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step([t for t, _, _ in trace], [g for _, _, g in trace], where="post", label="γ")
    ax.step([t for t, _, _ in trace], [b for _, b, _ in trace], where="post", label="batch", alpha=0.6)
    ax.set(xlabel="seconds into the stream", ylabel="per step", title=_title(payload) + " · request load")
    ax.legend(fontsize="small")
    return _save(plt, fig, folder / "gamma_over_time.png")


def _mean_gamma(prompt: dict) -> float:
    trace = prompt["speculative"]["stats"]["gamma_trace"]
    return sum(trace) / len(trace) if trace else 0.0


def _title(payload: dict) -> str:
    s = payload["strategy"]
    return f"{payload['model']} · {s['proposer']} · {s['controller']} · γ={s['gamma']}"


def _save(plt, fig, path: Path) -> Path:
    """A plot is drawn from results already saved: failing to write one loses no measurement."""
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise SpecpipeError(f"Could not write the plot {path} ({why(path, err)}). The results it draws are saved "
                            "(`results:` above, or `summary:` for a sweep); plots need a writable folder.") from None
    finally:
        plt.close(fig)
    return path
