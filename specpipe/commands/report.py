"""`specpipe report DIR [plot=true]`: one table over every finished job of a sweep folder.

Reads each `results.json` under DIR (a job that did not finish has none), prints one row per
job, writes DIR/summary.json and, with plot=true, the sweep plots. `SweepSummary` does the same
at the end of `specpipe bench -m ...` (a Hydra callback named in conf/bench.yaml).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from rich.console import Console

from specpipe.bench import plots
from specpipe.bench.results import RESULTS_FILE, now, read_results, write_json
from specpipe.bench.summary import OVERALL
from specpipe.bench.table import sweep_markdown, sweep_table
from specpipe import errors, streams
from specpipe.errors import SpecpipeError
from specpipe.markup import esc
from specpipe.ui.tables import show
from specpipe.outputs import save_or_keep

USAGE = ("usage: specpipe report DIR [plot=true] [markdown=true]   (DIR: the `out=` folder of a bench sweep "
         "or run; markdown=true prints a Markdown table by job and category)")


def run(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    flags = {"plot": False, "markdown": False}
    setting = lambda arg: arg.partition("=")[0] in flags and "=" in arg and not Path(arg).exists()  # noqa: E731
    folders = [arg for arg in args if not setting(arg)]
    for arg in [arg for arg in args if setting(arg)] + folders[1:]:
        key, _, value = arg.partition("=")
        if key not in flags:
            raise SpecpipeError(f"`{arg}` is not a report setting (they are {', '.join(f'{k}=' for k in flags)}). "
                                f"{USAGE}")
        if value.lower() not in ("true", "false"):
            raise SpecpipeError(f"{key}={value} is not true or false: pass {key}=true or {key}=false. {USAGE}")
        flags[key] = value.lower() == "true"
    if not folders:  # `specpipe report plot=true`: the settings are read as such, the folder is missing
        raise SpecpipeError(f"`specpipe report {' '.join(args)}` names no folder: give the `out=` folder of a bench "
                            f"sweep or run first, e.g. specpipe report sweeps/smollm {' '.join(args)}. {USAGE}")
    report(Path(folders[0]), **flags)
    return 0


def finished_jobs(folder: Path) -> list[tuple[str, dict]]:
    """(job name: its folder relative to the sweep, results) for every finished job, by name."""
    if not folder.is_dir():
        raise SpecpipeError(f"{folder} is not a folder. Give the `out=` folder of a bench sweep.")
    paths = sorted(folder.rglob(RESULTS_FILE))
    if not paths:
        raise SpecpipeError(f"{folder} holds no {RESULTS_FILE}: no job of that sweep has finished yet.")
    return [(str(p.parent.relative_to(folder)) or ".", read_results(p)) for p in paths]


def report(folder: Path, plot: bool = False, markdown: bool = False) -> None:
    jobs = finished_jobs(folder)
    if markdown:
        print(sweep_markdown(jobs))
    else:
        show(sweep_table(jobs))
    rows = [{"job": name, "model": p["model"], **p["strategy"], "overall": p["summary"][OVERALL]}
            for name, p in jobs]
    err = Console(stderr=True)
    payload = {"created": now(), "jobs": rows}
    err.print(f"summary: {esc(save_or_keep(lambda path: write_json(path, payload), folder / 'summary.json', 'the summary'))}")
    if plot:
        for png in plots.plot_sweep(jobs, folder):
            err.print(f"plot: {esc(png)}")


class SweepSummary(Callback):
    """After `specpipe bench -m ...`: the sweep's table, over every job finished so far."""

    def on_multirun_end(self, config, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir)
        if any(folder.rglob(RESULTS_FILE)):
            try:
                report(folder, plot=bool(config.get("plot", False)))
            except SpecpipeError as err:  # every job's results.json is saved already; say so, no traceback
                sys.exit(errors.report(err))
            except streams.StreamFailed as err:  # a closed pipe or full disk on stdout: as a single run ends
                sys.exit(streams.ended(err))
