"""`specpipe <command> key=value ...`: a thin dispatcher; Hydra owns the overrides.

A single run composes the config with Hydra's compose API (so a bad override becomes a clear
error with exit code 2) and calls the command directly: no output folders. Any Hydra flag
(`-m` multirun, `--cfg job`, `--help`) hands argv to `hydra.main` unchanged.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from rich.console import Console

from specpipe.config import compose
from specpipe.errors import SpecpipeError

USAGE = """usage: specpipe <command> [key=value ...]

commands:
  generate   decode a prompt speculatively with a live view, then measure the plain target
  check      the compatibility checks of a configuration (same settings as generate), no weights
  bench      a strategy over a prompt set against the plain target (and peers); -m sweeps
  report     one table (and plots) over a sweep's folder: specpipe report DIR [plot=true]
  tune       sweep the sensible strategies for a target; write the winner as a recipe
  train      heads for a frozen target (proposer=medusa), written as a recipe with its figures
  export     a recipe (or settings) as vLLM or SGLang configuration: specpipe export vllm|sglang ...
  models     list the built-in model zoo; `specpipe models fetch NAME` fetches one

examples:
  specpipe generate prompt="Write a haiku about caches"
  specpipe generate model=qwen2.5-coder-1.5b proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4
  specpipe generate verifier=rejection temperature=0.7 seed=1 output=json
  specpipe bench prompts=dev categories=[code-edit,chat] limit=3 peer=hf-prompt-lookup
  specpipe bench -m proposer=draft,twin gamma=2,4,6 model=qwen2.5-coder-1.5b out=sweeps/qwen
  specpipe tune model=smollm2-135m prompts=dev limit=2
  specpipe export vllm recipe=recipes/smollm2-135m
"""


def _hydra_commands() -> dict[str, Callable]:
    from specpipe.commands import bench, check, generate, train, tune

    return {"generate": generate.run, "check": check.run, "bench": bench.run, "tune": tune.run, "train": train.run}


def _plain_commands() -> dict[str, Callable]:
    """Commands that take their own arguments first (a folder, an export format)."""
    from specpipe.commands import export, models, report

    return {"models": models.run, "report": report.run, "export": export.run}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    try:
        plain = _plain_commands()
        if command in plain:
            return plain[command](rest)
        commands = _hydra_commands()
        if command not in commands:
            raise SpecpipeError(f"Unknown command '{command}'. Commands: {', '.join([*commands, *plain])}.")
        return _run_hydra(command, commands[command], rest)
    except SpecpipeError as err:
        return report(err)
    except KeyboardInterrupt:
        return 130


def report(err: SpecpipeError) -> int:
    Console(stderr=True).print(f"[bold red]error:[/bold red] {err}", highlight=False)
    return err.exit_code


def _run_hydra(command: str, task: Callable, overrides: list[str]) -> int:
    from specpipe.config import conf_dir, expand_overrides

    if command == "generate":
        overrides, prompts = take_prompts(overrides)
        if prompts:
            task = functools.partial(task, prompts=prompts)
    if any(arg.startswith("-") for arg in overrides):
        flags, settings = _split_flags(overrides)
        # Hydra reads its flags before the overrides: a recipe's settings, which expansion puts
        # in front of the user's, must not land before `-m`
        return _hydra_main(command, task, flags + expand_overrides(settings, conf_dir()))
    return task(compose(overrides, command)) or 0


def take_prompts(args: list[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the texts of every `prompt=` argument, verbatim). Prompts never go
    through Hydra's grammar or OmegaConf's interpolation: a prompt is text, with its commas,
    quotes, parentheses and `${...}` as typed. Several `prompt=` decode as a batch."""
    rest, prompts = [], []
    for arg in args:
        if arg.startswith("prompt="):
            prompts.append(arg[len("prompt="):])
        else:
            rest.append(arg)
    return rest, prompts


_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                "-cd", "--info", "--experimental-rerun"}  # Hydra flags that take the next argument


def _split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the key=value settings), each in the order given."""
    flags, settings, i = [], [], 0
    while i < len(args):
        if args[i].startswith("-"):
            takes_value = args[i] in _VALUE_FLAGS and i + 1 < len(args) and "=" not in args[i + 1]
            flags += args[i : i + 2] if takes_value else [args[i]]
            i += 2 if takes_value else 1
        else:
            settings.append(args[i])
            i += 1
    return flags, settings


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
