"""Rich tables: one bench run by category (`bench_table`), and a whole sweep (`sweep_table`)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from specpipe.bench.summary import OVERALL
from specpipe.markup import esc


def bench_table(payload: dict) -> Group:
    """Two tables (so each fits a terminal): the headline figures, then how the steps went."""
    strategy = payload["strategy"]
    title = (f"specpipe bench: {esc(payload['model'])} · proposer {strategy['proposer']} · controller "
             f"{strategy['controller']} · γ={strategy['gamma']} · verifier {strategy['verifier']}"
             + f" · guard {'on' if strategy.get('guard') else 'off'}"
             + ("" if strategy["lossless"] else " [bold yellow](LOSSY)[/bold yellow]"))
    head = Table(title=title, caption="speedup: median (min-max) over prompts, each against the plain target "
                 "on the same prompt in the same run")
    steps = Table(caption="per-position acceptance: P(draft token i accepted | drafted); γ: mean \\[min-max] and "
                  "the share of steps without a draft; guard γ=0: steps the guard held at γ = 0 (speculation "
                  "paused, or a plain probe) of all steps; time/token: P50 / P99 ms")
    for column in ("category", "prompts", "plain tok/s", "tok/s", "speedup", "worst prompt", "acceptance", "τ", "exact"):
        head.add_column(column, justify="left" if column == "category" else "right")
    for column in ("category", "per-position acceptance", "γ", "guard γ=0", "time/token plain", "time/token spec"):
        steps.add_column(column, justify="left" if column not in ("γ", "guard γ=0") else "right")
    for category, fig in payload["summary"].items():
        style = "bold" if category == OVERALL else None
        head.add_row(esc(category), str(fig["prompts"]), f"{fig['baseline_tokens_per_s']:.1f}", f"{fig['tokens_per_s']:.1f}",
                     speedup_cell(fig["speedup"]), worst_cell(fig.get("worst")), f"{fig['acceptance_rate']:.2f}",
                     f"{fig['mean_accepted_length']:.2f}", exact_cell(fig["exactness"]), style=style)
        for name, peer in fig["peers"].items():
            head.add_row(f"  ↳ {esc(name)}", "", "", f"{peer['tokens_per_s']:.1f}", speedup_cell(peer["speedup"]),
                         "", "", "", exact_cell(peer["exactness"], peer=True), style="dim")
        tpt = fig["time_per_token_ms"]
        steps.add_row(esc(category), positions_cell(fig["per_position_acceptance"]), gamma_cell(fig["gamma"]),
                      guard_cell(fig.get("guard")), tpt_cell(tpt["baseline"]), tpt_cell(tpt["speculative"]), style=style)
    return Group(head, steps)


def load_table(payload: dict) -> Table:
    """A request load: plain and speculative side by side (and peers), then per category."""
    load = payload["load"]
    table = Table(title=f"request load: {load['requests']} requests, concurrency {load['concurrency']}"
                  + (f" (run at 1: {esc(load['batch_refusal'])})" if load["batch_refusal"] else ""),
                  caption="latency, TTFT (time to first token), TPOT (time per output token after the first): "
                  "P50 / P90 / P99 ms over requests")
    for column in ("run", "tok/s", "req/s", "speedup", "latency", "TTFT", "TPOT", "acceptance", "τ", "guard γ=0"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name in ("plain", "speculative"):
        fig = load[name]
        table.add_row(name, f"{fig['tokens_per_s']:.1f}", f"{fig['requests_per_s']:.2f}",
                      "1.00x" if name == "plain" else speedup_cell({"median": load["speedup"], "min": load["speedup"],
                                                                    "max": load["speedup"]}).split(" (")[0],
                      _p3(fig["latency_ms"]), _p3(fig["ttft_ms"]), _p3(fig["tpot_ms"]),
                      "" if name == "plain" else f"{fig['acceptance_rate']:.2f}",
                      "" if name == "plain" else f"{fig['mean_accepted_length']:.2f}",
                      "" if name == "plain" else guard_cell({"held": fig.get("guard_held", 0),
                                                             "steps": fig.get("row_steps", 0)}))
    for name, peer in load["peers"].items():
        table.add_row(f"↳ {esc(name)}", f"{peer['tokens_per_s']:.1f}", f"{peer['requests_per_s']:.2f}",
                      f"{peer['speedup']:.2f}x", "", "", "", "", "", "", style="dim")
    for category, fig in load["by_category"].items():
        rate, tau = fig["acceptance_rate"], fig["mean_accepted_length"]
        table.add_row(f"  {esc(category)} ({fig['requests']})", "", "", speedup_cell(fig["speedup"]), "", "",
                      _p3(fig["tpot_ms"]["speculative"]), f"{rate['median']:.2f} ({rate['min']:.2f}-{rate['max']:.2f})",
                      f"{tau['median']:.2f} ({tau['min']:.2f}-{tau['max']:.2f})", "", style="dim")
    return table


def _p3(ms: dict | None) -> str:
    return f"{ms['p50']:.0f}/{ms['p90']:.0f}/{ms['p99']:.0f}" if ms else "-"


def sweep_table(jobs: list[tuple[str, dict]]) -> Table:
    """One row per finished job: its settings, then overall and per-category median speedups."""
    categories = list(dict.fromkeys(c for _, p in jobs for c in p["summary"] if c != OVERALL))
    table = Table(title=f"specpipe sweep: {len(jobs)} finished job(s)",
                  caption="speedup: median over prompts against the plain target, same run")
    for column in ("job", "model", "proposer", "controller", "γ", "speedup", "worst prompt", *categories, "acceptance",
                   "τ", "guard γ=0", "exact", "peers"):
        table.add_column(esc(column), justify="left" if column in ("job", "model", "proposer", "controller") else "right")
    for name, payload in jobs:
        overall, strategy = payload["summary"][OVERALL], payload["strategy"]
        per_category = [f"{payload['summary'][c]['speedup']['median']:.2f}x" if c in payload["summary"] else "-"
                        for c in categories]
        table.add_row(esc(name), esc(payload["model"]), esc(strategy["proposer"]), esc(strategy["controller"]), esc(strategy["gamma"]),
                      speedup_cell(overall["speedup"]), worst_cell(overall.get("worst")), *per_category,
                      f"{overall['acceptance_rate']:.2f}", f"{overall['mean_accepted_length']:.2f}",
                      guard_cell(overall.get("guard")), exact_cell(overall["exactness"]),
                      " ".join(f"{esc(n)} {p['speedup']['median']:.2f}x" for n, p in overall["peers"].items()) or "-")
    return table


def load_markdown(jobs: list[tuple[str, dict]]) -> str:
    """Request loads as a Markdown table, a row per job (concurrency), plain and speculative side
    by side, the per-category speedups (median over each category's requests) in one cell."""
    lines = ["| model | engine | proposer | controller | concurrency | requests | plain tok/s | tok/s | speedup "
             "| TPOT P50/P99 ms plain | TPOT P50/P99 ms spec | τ | γ mean | by category | peers tok/s | exact |",
             "|" + "---|" * 16]
    for _, payload in sorted(jobs, key=lambda job: (job[1]["strategy"]["proposer"], job[1]["load"]["concurrency"])):
        load, strategy = payload["load"], payload["strategy"]
        tpot = {m: load[m]["tpot_ms"] for m in ("plain", "speculative")}
        categories = ", ".join(f"{c} {f['speedup']['median']:.2f}x" for c, f in load["by_category"].items())
        peers = "; ".join(f"{n} {p['tokens_per_s']:.1f}" for n, p in load["peers"].items()) or "-"
        gammas = [g for _, _, g in load["gamma_over_time"]]
        lines.append(
            f"| {payload['model']} | {engine_text(payload)} | {strategy['proposer']} | {strategy['controller']} "
            f"| {load['concurrency']}{' (ran at 1)' if load['batch_refusal'] else ''} | {load['requests']} "
            f"| {load['plain']['tokens_per_s']:.1f} | {load['speculative']['tokens_per_s']:.1f} | {load['speedup']:.2f}x "
            f"| {_p50_p99(tpot['plain'])} | {_p50_p99(tpot['speculative'])} "
            f"| {load['speculative']['mean_accepted_length']:.2f} | {sum(gammas) / max(len(gammas), 1):.1f} "
            f"| {categories} | {peers} | {_exact_text(load['exact'])} |")
    return "\n".join(lines)


def _p50_p99(ms: dict | None) -> str:
    return f"{ms['p50']:.0f}/{ms['p99']:.0f}" if ms else "-"


def sweep_markdown(jobs: list[tuple[str, dict]]) -> str:
    """The sweep as a Markdown table, a row per job and category (what the README's tables are)."""
    if all("load" in payload for _, payload in jobs):
        return load_markdown(jobs)
    lines = ["| model | engine | proposer | controller | γ | category | prompts | plain tok/s | tok/s "
             "| speedup (median, min-max) | acceptance | τ | per-position acceptance | guard γ=0 | peer: speedup | exact |",
             "|" + "---|" * 16]
    for _, payload in jobs:
        strategy = payload["strategy"]
        for category, fig in payload["summary"].items():
            s = fig["speedup"]
            peers = "; ".join(f"{name} {p['speedup']['median']:.2f}x ({_exact_text(p['exactness'])})"
                              for name, p in fig["peers"].items()) or "-"
            lines.append(
                f"| {payload['model']} | {engine_text(payload)} | {strategy['proposer']} | {strategy['controller']} | {strategy['gamma']} "
                f"| {category} | {fig['prompts']} | {fig['baseline_tokens_per_s']:.1f} | {fig['tokens_per_s']:.1f} "
                f"| {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}) | {fig['acceptance_rate']:.2f} "
                f"| {fig['mean_accepted_length']:.2f} | {positions_cell(fig['per_position_acceptance'])} "
                f"| {guard_cell(fig.get('guard'))} | {peers} "
                f"| {_exact_text(fig['exactness'])} |")
    return "\n".join(lines)


def engine_text(payload: dict) -> str:
    """The target's engine and precision (results written before engines existed: hf)."""
    engine = payload.get("engine") or {"target": "hf", "precision": payload["config"]["model"].get("quantize", "")}
    return f"{engine['target']} {engine['precision']}".strip()


def _exact_text(exactness: dict | None) -> str:
    return "n/a" if exactness is None else f"{exactness['identical']}/{exactness['of']}"


def speedup_cell(spread: dict) -> str:
    color = "green" if spread["median"] >= 1.0 else "red"
    return f"[{color}]{spread['median']:.2f}x[/{color}] ({spread['min']:.2f}-{spread['max']:.2f})"


def positions_cell(rates: list[float], shown: int = 6) -> str:
    return " ".join(f"{r:.2f}" for r in rates[:shown]) + (" …" if len(rates) > shown else "") or "-"


def gamma_cell(gamma: dict) -> str:
    return f"{gamma['mean']:.1f} [{gamma['min']}-{gamma['max']}] off {gamma['off_share']:.0%}"


def worst_cell(worst: dict | None) -> str:
    """The worst prompt's speedup and id (results written before it was recorded: -)."""
    if not worst:
        return "-"
    color = "green" if worst["speedup"] >= 1.0 else "red"
    return f"[{color}]{worst['speedup']:.2f}x[/{color}] {esc(worst['id'])}"


def guard_cell(guard: dict | None) -> str:
    if not guard or not guard["steps"]:
        return "-"
    return f"{guard['held']}/{guard['steps']} ({guard['held'] / guard['steps']:.0%})"


def tpt_cell(ms: dict | None) -> str:
    return f"{ms['p50']:.0f}/{ms['p99']:.0f}" if ms else "-"


def exact_cell(exactness: dict | None, peer: bool = False) -> str:
    """specpipe's own divergence is a failure (bench exits 1 on it); a peer's is that peer's own
    kernels parting from the plain target, reported as such (it fails nothing of specpipe's)."""
    if exactness is None:
        return "n/a (sampling)"
    text = f"{exactness['identical']}/{exactness['of']}"
    if exactness["share"] == 1.0:
        return text
    return f"{text} (the peer's own output)" if peer else f"[bold red]{text} FAIL[/bold red]"
