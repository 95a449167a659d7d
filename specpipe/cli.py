"""`specpipe <command> key=value ...`: a thin dispatcher; Hydra owns the overrides.

A single run composes the config with Hydra's compose API (so a bad override becomes a clear
error with exit code 2) and calls the command directly: no output folders. Any Hydra flag
(`-m` multirun, `--cfg job`, `--help`) hands argv to `hydra.main` unchanged.
"""

from __future__ import annotations

import sys
from typing import Callable

from rich.console import Console

from specpipe.config import compose
from specpipe.errors import SpecpipeError

USAGE = """usage: specpipe <command> [key=value ...]

commands:
  generate   decode a prompt speculatively with a live view, then measure the plain target
  check      the compatibility checks of a configuration (same settings as generate), no weights
  models     list the built-in model zoo; `specpipe models fetch NAME` fetches one

examples:
  specpipe generate prompt="Write a haiku about caches"
  specpipe generate model=qwen2.5-coder-1.5b proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4
  specpipe generate verifier=rejection temperature=0.7 seed=1 output=json
"""


def _hydra_commands() -> dict[str, Callable]:
    from specpipe.commands import check, generate

    return {"generate": generate.run, "check": check.run}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command == "models":
            from specpipe.commands import models

            return models.run(rest)
        commands = _hydra_commands()
        if command not in commands:
            raise SpecpipeError(f"Unknown command '{command}'. Commands: models, {', '.join(commands)}.")
        return _run_hydra(command, commands[command], rest)
    except SpecpipeError as err:
        return report(err)
    except KeyboardInterrupt:
        return 130


def report(err: SpecpipeError) -> int:
    Console(stderr=True).print(f"[bold red]error:[/bold red] {err}", highlight=False)
    return err.exit_code


def _run_hydra(command: str, task: Callable, overrides: list[str]) -> int:
    from specpipe.config import conf_dir, rewrite_model_overrides

    if any(arg.startswith("-") for arg in overrides):
        return _hydra_main(command, task, rewrite_model_overrides(overrides, conf_dir()))
    return task(compose(overrides, command)) or 0


def _hydra_main(command: str, task: Callable, overrides: list[str]) -> int:
    import hydra

    from specpipe.config import conf_dir, register

    register()
    def guarded(cfg) -> None:
        try:
            code = task(cfg) or 0
        except SpecpipeError as err:
            sys.exit(report(err))
        if code:
            sys.exit(code)

    sys.argv = [f"specpipe {command}", *overrides]
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=command)(guarded)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
