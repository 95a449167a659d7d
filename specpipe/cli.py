"""`specpipe <command> key=value ...`: a thin dispatcher; Hydra owns the overrides.

A single run composes the config with Hydra's compose API (so a bad override becomes a clear
error with exit code 2) and calls the command directly: no output folders. Any Hydra flag
(`-m` multirun, `--cfg job`, `--help`) hands argv to `hydra.main` unchanged.
"""

from __future__ import annotations

import sys
from typing import Callable

from rich.console import Console

from specpipe.errors import SpecpipeError

USAGE = """usage: specpipe <command> [key=value ...]

commands:
  generate   decode a prompt speculatively with a live view, then measure the plain target
  models     list the built-in model zoo; `specpipe models fetch NAME` fetches one

examples:
  specpipe generate prompt="Write a haiku about caches"
  specpipe generate model=qwen2.5-coder-1.5b proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4
  specpipe generate verifier=rejection temperature=0.7 seed=1 output=json
"""


def _hydra_commands() -> dict[str, Callable]:
    from specpipe.commands import generate

    return {"generate": generate.run}


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
    from specpipe.config import conf_dir

    overrides = rewrite_model_overrides(overrides, conf_dir())
    if any(arg.startswith("-") for arg in overrides):
        return _hydra_main(command, task, overrides)
    task(compose(command, overrides))
    return 0


def compose(command: str, overrides: list[str]):
    """The composed, resolved config of `command`; a bad override is a SpecpipeError."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from specpipe.config import conf_dir, register

    register()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir()), job_name="specpipe"):
            cfg = hydra_compose(config_name=command, overrides=overrides)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        detail = _condense(str(err))
        if err.__cause__ is not None:  # e.g. "Key 'quantize' is not in struct"
            detail += " (" + str(err.__cause__).splitlines()[0] + " for this choice.)"
        raise SpecpipeError(
            f"The settings `{' '.join(overrides)}` are not valid: {detail} Settings are key=value "
            f"pairs from conf/{command}.yaml; components are chosen by name (proposer=draft, "
            "verifier=rejection, ...) from the folders of conf/."
        ) from None
    if "hydra" in cfg:
        with _unlocked(cfg):
            del cfg["hydra"]
    return cfg


def _condense(message: str) -> str:
    """Hydra's multi-line message as one sentence, without its search-path dump and `+key` hint."""
    message = message.split("Config search path")[0]
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and not line.startswith("To append"))


def _unlocked(cfg):
    from omegaconf import open_dict

    return open_dict(cfg)


def _hydra_main(command: str, task: Callable, overrides: list[str]) -> int:
    import hydra

    from specpipe.config import conf_dir, register

    register()
    def guarded(cfg) -> None:
        try:
            task(cfg)
        except SpecpipeError as err:
            sys.exit(report(err))

    sys.argv = [f"specpipe {command}", *overrides]
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=command)(guarded)()
    return 0


def rewrite_model_overrides(overrides: list[str], conf) -> list[str]:
    """`model=PATH_OR_HUB_ID` (not a file of conf/model/) -> `model=custom model.name=...`."""
    known = {p.stem for p in (conf / "model").glob("*.yaml")}
    out = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if key == "model" and eq and value not in known and "," not in value:
            escaped = value.replace("\\", "\\\\").replace("'", "\\'")
            out += ["model=custom", f"model.name='{escaped}'"]
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
