"""`specpipe <command> key=value ...`: a thin dispatcher; Hydra owns the overrides.

A single run composes the config with Hydra's compose API (so a bad override becomes a clear
error with exit code 2) and calls the command directly: no output folders. Any Hydra flag
(`-m` multirun, `--cfg job`, `--help`) hands argv to `hydra.main` unchanged.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Callable

from specpipe import streams
from specpipe.config import compose
from specpipe.errors import SpecpipeError, report
from specpipe.prompt_args import argv_text, decode_text, is_flag

USAGE = """usage: specpipe <command> [key=value ...]
       specpipe generate|check ["PROMPT" ... | - | prompt_file=PATH] [key=value ...]

commands:
  generate   decode a prompt speculatively with a live view, then measure the plain target
  check      the compatibility checks of a configuration (same settings as generate), no weights
  bench      a strategy over a prompt set against the plain target (and peers); -m sweeps
  report     one table (and plots) over a sweep's folder: specpipe report DIR [plot=true]
  tune       sweep the sensible strategies for a target: chosen on one prompt set, reported on
             another; write what holds up as a recipe
  train      heads for a frozen target (proposer=medusa), written as a recipe with its figures
  export     a recipe (or settings) as vLLM or SGLang configuration: specpipe export vllm|sglang ...
  models     list the built-in model zoo; `specpipe models fetch NAME` fetches one
  install    `specpipe install llamacpp`: build llama-cpp-python for engine=llamacpp (CPU flags that work here)

examples:
  specpipe generate "Write a haiku about caches"
  echo "Hi, how are you?" | specpipe generate - output=text
  specpipe generate model=qwen2.5-coder-1.5b proposer=draft proposer.model=qwen2.5-coder-0.5b gamma=4
  specpipe generate verifier=rejection temperature=0.7 seed=1 output=json
  specpipe bench prompts=dev categories=[code-edit,chat] limit=3 peer=hf-prompt-lookup
  specpipe bench -m proposer=draft,twin gamma=2,4,6 model=qwen2.5-coder-1.5b out=sweeps/qwen
  specpipe tune model=smollm2-135m choose_on=dev report_on=held-aside limit=2
  specpipe export vllm recipe=recipes/smollm2-135m
"""


def _hydra_commands() -> dict[str, Callable]:
    from specpipe.commands import bench, check, generate, train, tune

    return {"generate": generate.run, "check": check.run, "bench": bench.run, "tune": tune.run, "train": train.run}


def _plain_commands() -> dict[str, Callable]:
    """Commands that take their own arguments first (a folder, an export format)."""
    from specpipe.commands import export, install, models, report

    return {"models": models.run, "report": report.run, "export": export.run, "install": install.run}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            with streams.guarded():  # a closed stdout is refused here; a failed write ends below
                code = _dispatch(argv)
        except SpecpipeError as err:
            code = report(err)
    except streams.StreamFailed as err:
        code = streams.ended(err)
    if code == SpecpipeError.exit_code:  # refused: no empty out= or work= folder is left behind
        from specpipe.outputs import remove_unused_folders

        remove_unused_folders()
    return code


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    _show_own_warnings()
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


def _show_own_warnings() -> None:
    """specpipe's own warnings (a max_new_tokens capped to the context) read `warning: ...`, not
    Python's `file:line: Category:` with a source line (the format only: recording them still works)."""
    import warnings

    default = warnings.formatwarning
    if getattr(default, "specpipe", False):
        return

    def plain(message, category, filename, lineno, line=None):
        from specpipe.context import ContextWarning

        if issubclass(category, ContextWarning):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    plain.specpipe = True
    warnings.formatwarning = plain


def _run_hydra(command: str, task: Callable, overrides: list[str]) -> int:
    from specpipe.config import conf_dir, expand_overrides, with_shipped_recipe

    prompts: list[str] = []
    if command in PROMPT_COMMANDS:
        overrides, prompts = take_prompts(overrides)
        if prompts:
            task = functools.partial(task, prompts=prompts)
    if any(arg.startswith("-") for arg in overrides):
        flags, settings = _split_flags(overrides)
        # naming no proposer means the target's shipped recipe (`compose` applies it to a single
        # run; a sweep's settings reach Hydra with it already in front)
        settings = with_shipped_recipe(settings, command, conf_dir())
        if prompts and _shows_config(flags):  # what would run: the prompt given, not the default one
            return _show_config(command, settings, prompts)
        if {"-m", "--multirun"} & set(flags):
            check_sweep(command, settings)  # every job's settings, before Hydra writes a folder
        # Hydra reads its flags before the overrides: a recipe's settings, which expansion puts
        # in front of the user's, must not land before `-m`
        return _hydra_main(command, task, flags + expand_overrides(settings, conf_dir()))
    return task(compose(overrides, command)) or 0


def check_sweep(command: str, settings: list[str]) -> None:
    """A `-m` sweep's settings, job by job, as a single run checks its own (compose, and the
    checks generate and bench make before any weights load): a bad value or range is one
    SpecpipeError naming the job, exit 2, and nothing is run or written (no multirun.yaml)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from specpipe.config import _condense

    try:
        parsed = OverridesParser.create().parse_overrides(settings)
    except HydraException as err:
        raise SpecpipeError(f"The sweep `{' '.join(settings)}` cannot be read: {_condense(str(err))} Write each "
                            "swept setting as key=a,b,c or key=range(START,STOP[,STEP]) with numbers. Nothing was "
                            "run.") from None
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    for job in jobs:
        own = [s for s in job if not s.lstrip("+~").startswith("hydra.")]  # Hydra's own settings: its to judge
        try:
            cfg = compose(own, command)
            if command in ("generate", "bench"):
                from specpipe.build import config_checks
                from specpipe.checks.result import refuse_if_any

                refuse_if_any(config_checks(cfg, fetch=False))
            if command == "bench":  # the peers bench names, as a single run checks them before any weights load
                from specpipe.bench.peers import load_peer_names, peer_names

                load_peer_names(cfg.peer) if cfg.requests > 0 else peer_names(cfg.peer, cfg.proposer, cfg.engine)
        except SpecpipeError as err:
            which = f"job {jobs.index(job) + 1} of {len(jobs)} ({' '.join(own)})" if len(jobs) > 1 else "the sweep"
            raise SpecpipeError(f"In {which}: {err} Nothing of the sweep was run.") from None


def _shows_config(flags: list[str]) -> bool:
    return any(flag in ("--cfg", "-c") or flag.startswith("--cfg=") for flag in flags)


def _show_config(command: str, settings: list[str], prompts: list[str]) -> int:
    """`--cfg job` with prompts given: the config that would run, those prompts in it (Hydra's
    printout would hold the default prompt: the prompts never go through its grammar)."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(compose(settings, command), resolve=True)
    config["prompt"] = prompts[0] if len(prompts) == 1 else prompts
    print(OmegaConf.to_yaml(OmegaConf.create(config)), end="")
    return 0


PROMPT_COMMANDS = ("generate", "check")  # commands that take prompts (check: to see what generate would)


def take_prompts(args: list[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the prompts in the order given). A prompt is text and never goes
    through Hydra's grammar or OmegaConf's interpolation: its commas, quotes, parentheses, `=`
    and `${...}` reach the tokenizer as typed. It comes as
      - a positional argument: anything that is not one of Hydra's flags nor `key=value` with a
        setting's key (`specpipe generate "Hi, how are you?" gamma=4`, `"-5 is negative"`); after
        `--`, every argument is one;
      - `prompt=TEXT`;
      - `prompt_file=PATH`: the file's text (UTF-8), less its trailing newlines;
      - `-`: standard input, read whole, likewise.
    Several prompts decode as a batch. Each is checked as a file's text is (prompt_args.py)."""
    rest, prompts, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            prompts += [argv_text(a) for a in args[i + 1:]]
            break
        if arg in _VALUE_FLAGS and i + 1 < len(args):  # `--cfg job`: the flag's value is no prompt
            rest += args[i:i + 2]
            i += 2
            continue
        if arg == "-":
            prompts.append(_read_stdin())
        elif arg.startswith("prompt="):
            prompts.append(argv_text(arg[len("prompt="):], "prompt="))
        elif arg.startswith("prompt_file="):
            prompts.append(_read_prompt_file(arg[len("prompt_file="):]))
        elif (arg.startswith("-") and is_flag(arg)) or _is_setting(arg):
            rest.append(arg)
        else:
            prompts.append(argv_text(arg))
        i += 1
    return rest, prompts


_SETTING = re.compile(r"^[+~]{0,2}([A-Za-z_][\w-]*)([.@/][\w@.-]*)*=")


def _is_setting(arg: str) -> bool:
    """`key=value` whose key starts with a setting of generate's schema (or hydra.*), or any
    `key=value` without a space (a misspelt `gama=4` is refused by name, never taken as a
    prompt); "x = 1, what is x+1?" stays a prompt (`prompt=a=b` for a prompt without spaces)."""
    from dataclasses import fields

    from specpipe.config import GenerateConfig

    match = _SETTING.match(arg)
    if not match:
        return False
    return match.group(1) in {f.name for f in fields(GenerateConfig)} | {"hydra"} or not any(c.isspace() for c in arg)


def _read_stdin() -> str:
    """`-`: standard input, whole; a closed one is refused before any work."""
    if streams.stdin_closed():
        raise SpecpipeError("`-` reads the prompt from standard input, but standard input is closed. Nothing was "
                            "run: pipe the prompt in (`echo \"Hi\" | specpipe generate -`), or pass it as an "
                            "argument or prompt_file=PATH.")
    try:
        data = sys.stdin.buffer.read()
    except (OSError, ValueError) as err:
        raise SpecpipeError(f"`-` reads the prompt from standard input, which cannot be read ({err}). Nothing was "
                            "run: pass the prompt as an argument or prompt_file=PATH.") from None
    return _read_text(data, "standard input")


def _read_prompt_file(path: str) -> str:
    """The file at `path` from the working directory; a relative path not there, from the project's
    root as the docs write it (`prompt_file=recipes/README.md` run anywhere)."""
    from specpipe.paths import looked_at, project_path

    given = Path(path).expanduser()
    shipped = None if given.exists() else project_path(path)
    try:
        data = (shipped or given).read_bytes()
    except OSError as err:
        where = "" if given.is_absolute() else f" (looked at {looked_at(path)})"
        raise SpecpipeError(f"prompt_file={path} cannot be read ({err.strerror or err}){where}. Give the path of a "
                            "text file holding the prompt, relative to the working directory or absolute, or pass "
                            "the prompt itself.") from None
    return _read_text(data, f"prompt_file={path}")


def _read_text(data: bytes, where: str) -> str:
    return decode_text(data, where).rstrip("\r\n")


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

    from specpipe.config import _precisions, conf_dir, register

    register()
    def guarded(cfg) -> None:
        try:
            code = task(_precisions(cfg)) or 0  # model.quantize=auto resolved, as `compose` does for a single run
        except SpecpipeError as err:
            sys.exit(report(err))
        except streams.StreamFailed as err:  # Hydra would print it as a crash
            sys.exit(streams.ended(err))
        if code:
            sys.exit(code)

    sys.argv = [f"specpipe {command}", *overrides]
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=command)(guarded)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
