"""`specpipe export vllm|sglang recipe=... [out=FILE]`: serving-engine settings for a composition.

Takes the same settings as `generate` (usually just `recipe=`); loads no weights. vLLM: writes
the speculative_config JSON (default speculative_config.json) and prints the `vllm serve`
command. SGLang: prints the launch command (and writes it to `out=` when given). What has no
equivalent is exported as the nearest setting, with a warning naming what is lost. The file's
folder is checked writable first; a write that fails anyway is kept elsewhere (specpipe/outputs.py).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specpipe.bench.results import write_json
from specpipe.build import config_checks
from specpipe.checks.result import refuse_if_any
from specpipe.config import compose, conf_dir, with_shipped_recipe
from specpipe.errors import SpecpipeError
from specpipe.export import sglang, vllm
from specpipe.export.plan import plan_of
from specpipe.markup import esc
from specpipe.outputs import atomic_write, save_or_keep, writable_output

ENGINES = {"vllm": vllm, "sglang": sglang}
USAGE = "usage: specpipe export vllm|sglang recipe=PATH [other generate settings] [out=FILE]"


def run(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] not in ENGINES:
        raise SpecpipeError(f"`specpipe export {args[0]}`: the engines are {', '.join(ENGINES)}. {USAGE}")
    out = next((a.partition("=")[2] for a in args[1:] if a.startswith("out=")), None)
    overrides = [a for a in args[1:] if not a.startswith("out=")]
    # what plain `generate` would run, recipe included: an export of anything else misleads
    cfg = compose(with_shipped_recipe(overrides, "generate", conf_dir()), "generate")
    # what `specpipe check` refuses, export refuses: a composition that cannot run is not exported
    checks = config_checks(cfg, fetch=False)
    refuse_if_any(checks)
    path = Path(out or "speculative_config.json")
    if args[0] == "vllm" or out:  # sglang writes nothing without out=
        writable_output(path.parent, f"out={path}", files=(path.name,))
    plan = plan_of(cfg, checks)
    result = vllm.export(plan) if args[0] == "vllm" else sglang.export(plan)
    err = Console(stderr=True)
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
