"""The README's examples run: every `specpipe` command line of its "Use" and "Bench" sections,
and of `specpipe --help`, that needs no model beyond SmolLM2, typed into a shell in a fresh
checkout of this repository (committed files only), each exits 0.

Quick settings are appended (Hydra keeps the last value of a key): a few new tokens, one chat
prompt, no warm-up, so the whole walk-through takes a few minutes, not an hour.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the real SmolLM2 (fetched once into the cache)

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("## Use", "## Bench, sweeps, recipes, export")
OTHER_MODELS = re.compile(r"qwen|/path/to|\.\.\.|models fetch|<")  # another model, or a placeholder
QUICK = {
    "generate": ["max_new_tokens=8"],
    "check": [],
    "bench": ["categories=[chat]", "limit=1", "max_new_tokens=8", "warmup=0"],
    # out=: the shipped recipe stays as committed, for the examples that read it
    "tune": ["categories=[chat]", "limit=1", "max_new_tokens=8", "warmup=0", "gammas=[4]", "strategies=[ngram,twin]",
             "out=tuned"],
}


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    commands = []
    for heading in SECTIONS:
        section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```bash\n(.*?)```", section, re.S):
            commands += shell_lines(block)
    return commands


def help_commands() -> list[str]:
    from specpipe.cli import USAGE

    return [line.strip() for line in USAGE.split("examples:")[1].splitlines() if line.strip()]


def shell_lines(block: str) -> list[str]:
    """The `specpipe ...` lines of a bash block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [re.split(r"\s+#\s", line)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if "specpipe " in line and not line.startswith("#")]


def runnable(command: str) -> bool:
    # installs are the set-up's (pip; `specpipe install llamacpp` builds llama.cpp for minutes: CI runs it once)
    return not OTHER_MODELS.search(command) and not command.startswith(("pip ", "specpipe install"))


def with_quick_settings(command: str) -> str:
    """The command, with quick settings after each `specpipe <command>` of the line's pipeline."""
    out = []
    for part in re.split(r"(\|\||&&|\|)", command):
        words = shlex.split(part) if part.strip() and part.strip() not in ("|", "||", "&&") else []
        name = words[1] if len(words) > 1 and words[0] == "specpipe" else None
        out.append(part.strip() + (" " + " ".join(shlex.quote(q) for q in QUICK.get(name, [])) if name else ""))
    return " ".join(out)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A fresh checkout: the committed tree only (no local recipes, results or caches)."""
    where = tmp_path_factory.mktemp("checkout") / "specpipe"
    if (ROOT / ".git").exists() and shutil.which("git"):
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(where)], check=True)
    else:
        shutil.copytree(ROOT, where, ignore=shutil.ignore_patterns("bench-results", "sweeps", ".git"))
    return where


def test_the_examples_are_found():
    commands = readme_commands()
    assert len(commands) >= 15 and any("recipe=recipes/smollm2-135m" in c for c in commands)
    assert sum(map(runnable, commands)) >= 10 and len(help_commands()) >= 5


def _param(command: str):
    """Sweeps and tunes (minutes even with quick settings) run with `pytest -m full`, the rest always."""
    heavy = " -m " in command or command.startswith(("specpipe tune", "specpipe report"))
    return pytest.param(command, marks=pytest.mark.full) if heavy else command


@pytest.mark.parametrize("command", [_param(c) for c in dict.fromkeys(c for c in readme_commands() + help_commands()
                                                                      if runnable(c))])
def test_example_runs_in_a_fresh_checkout(command, checkout):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "160"}
    result = subprocess.run(["bash", "-c", with_quick_settings(command)], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
