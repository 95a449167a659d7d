"""`specpipe export vllm|sglang recipe=... [out=FILE] [engine_version=X]`: serving-engine settings
for a composition.

Takes the same settings as `generate` (usually just `recipe=`); loads and downloads no weights
(a zoo model not fetched is judged by its zoo entry). vLLM: writes the speculative_config JSON
(default speculative_config.json) for vLLM 0.34.0, or 0.33.0 with `engine_version=0.33.0`, and
prints the `vllm serve` command. SGLang: prints the launch command (and writes it to `out=` when
given). What has no equivalent is exported as the nearest setting, with a warning naming what is
lost. A composition that cannot be exported is refused (exit 2) before anything is written; the
file's folder is checked writable before the file is; a write that fails anyway is kept
elsewhere (specpipe/outputs.py).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specpipe.bench.results import write_json
from specpipe.build import config_checks
from specpipe.checks.result import refuse_if_any
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.export import sglang, vllm
from specpipe.export.plan import plan_of
from specpipe.settings import resolve
from specpipe.markup import esc
from specpipe.outputs import atomic_write, save_or_keep, writable_output

ENGINES = {"vllm": vllm, "sglang": sglang}
USAGE = ("usage: specpipe export vllm|sglang recipe=PATH [other generate settings] [out=FILE] "
         f"[engine_version={vllm.VERSION}|{'|'.join(v for v in vllm.VERSIONS if v != vllm.VERSION)} for vllm, "
         f"{sglang.VERSION} for sglang]")
OWN = ("out", "engine_version")  # export's own settings, never Hydra's


def run(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] not in ENGINES:
        raise SpecpipeError(f"`specpipe export {args[0]}`: the engines are {', '.join(ENGINES)}. {USAGE}")
    own = {key: a.partition("=")[2] for a in args[1:] for key in OWN if a.startswith(f"{key}=")}
    overrides = [a for a in args[1:] if a.partition("=")[0] not in OWN]
    engine = ENGINES[args[0]]
    version = engine.pinned(own.get("engine_version"))  # a version we do not write is refused before anything runs
    # what plain `generate` would run, the shipped recipe included (compose applies it): an export of anything
    # else misleads
    cfg = compose(overrides, "generate")
    # what `specpipe check` refuses, export refuses: a composition that cannot run is not exported
    settings = resolve(cfg, fetch=False)  # resolved once: the checks and the plan read the same choices
    checks = config_checks(cfg, settings)
    refuse_if_any(checks)
    result = engine.export(plan_of(cfg, settings, checks), version)  # refuses (exit 2) what it cannot export, writing nothing
    out = own.get("out")
    path = Path(out or "speculative_config.json")
    if args[0] == "vllm" or out:  # sglang writes nothing without out=
        writable_output(path.parent, f"out={path}", files=(path.name,))
    err = Console(stderr=True)
    err.print(_target_line(args[0], result.version), highlight=False)
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {esc(warning)}", highlight=False)
    if result.engine == "vllm" and result.settings:
        written = save_or_keep(lambda to: write_json(to, result.settings), path, "the speculative_config")
        err.print(f"speculative_config ({result.engine} {result.version}): {esc(written)}")
    elif out:
        written = save_or_keep(lambda to: atomic_write(to, lambda f: f.write(result.command + "\n")), path,
                               "the launch command")
        err.print(f"command: {esc(written)}")
    print(result.command)
    return 0


def _target_line(engine: str, version: str) -> str:
    """Which engine version the settings follow, and how to reach the others."""
    others = [v for v in ENGINES[engine].VERSIONS if v != version]
    line = f"exporting for {engine} {version}"
    return line + (f" (for {', '.join(others)}: engine_version={others[0]})" if others else "")
