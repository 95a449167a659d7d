"""`specpipe export vllm|sglang recipe=... [out=FILE]`: serving-engine settings for a composition.

Takes the same settings as `generate` (usually just `recipe=`); loads no weights. vLLM: writes
the speculative_config JSON (default speculative_config.json) and prints the `vllm serve`
command. SGLang: prints the launch command (and writes it to `out=` when given). What has no
equivalent is exported as the nearest setting, with a warning naming what is lost.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specpipe.bench.results import write_json
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.export import sglang, vllm
from specpipe.export.plan import plan_of

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
    result = ENGINES[args[0]].export(plan_of(compose(overrides, "generate")))
    err = Console(stderr=True)
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    if result.engine == "vllm" and result.settings:
        path = write_json(Path(out or "speculative_config.json"), result.settings)
        err.print(f"speculative_config ({result.engine} {result.version}): {path}")
    elif out:
        _write_text(Path(out), result.command + "\n")
        err.print(f"command: {out}")
    print(result.command)
    return 0


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
