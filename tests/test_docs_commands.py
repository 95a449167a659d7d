"""Every command of README.md and docs/*.md runs as documented, from outside the checkout.

The commands are the `specpipe ...` and `python -m specpipe ...` lines of the pages' code blocks
(continuations joined, comments dropped, `NAME="..."` lines of a block expanded where `$NAME` is
used, `echo TEXT | specpipe ... -` fed TEXT). Each runs with a fresh empty folder outside the
repository as its working directory, so `recipe=recipes/...`, `prompt_file=recipes/README.md` or
`strategy=NAME` must resolve against the installed project, not the checkout's working directory.

The default set runs every command through the CLI in this process, up to the point where it
would start the work: loading weights (the checks that come first run, without fetching a
model), training, fetching a model, building llama.cpp, reading a sweep's results. So a
documented command whose settings do not parse, whose recipe, prompt file, strategy, prompt set
or peer does not resolve, or whose configuration a check refuses fails here. A refusal that
only this machine causes (no CUDA GPU for `device=cuda`, no llama-cpp-python where the page says
to install it) is accepted as long as it says so. `-m full` runs them all for real instead, one
subprocess each, page by page in one folder (a report reads the sweep written before it): hours.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"/path/to/|<[^>\s]+>")  # a path or name the reader fills in
SEPARATORS = {"&&", "||", "|", ";"}


@dataclass(frozen=True)
class DocCommand:
    page: str  # README.md, docs/usage.md, ...
    line: str  # the shell line as written (continuations joined, comment dropped)
    argv: tuple[str, ...]  # what follows `specpipe`
    stdin: str | None = None  # what `echo TEXT |` pipes in

    def __str__(self) -> str:
        return f"{self.page}: specpipe {shlex.join(self.argv)}"


def doc_commands() -> list[DocCommand]:
    found = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for block in re.findall(r"^```[\w-]*\n(.*?)^```", page.read_text(), re.S | re.M):
            variables: dict[str, str] = {}
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                assignment = re.fullmatch(r"\s*([A-Z_][A-Z0-9_]*)=(.*)", line)
                if assignment:  # QWEN="model=... limit=2": used as $QWEN below it
                    variables[assignment.group(1)] = " ".join(shlex.split(assignment.group(2)))
                    continue
                for var, value in variables.items():
                    line = re.sub(r"\$\{?" + var + r"\b\}?", value, line)
                found += _commands_of(name, line)
    return found


def _commands_of(page: str, line: str) -> list[DocCommand]:
    """The specpipe commands of one shell line (a pipeline or a list of them)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # not shell (prose in a block)
        return []
    parts = [list(group) for sep, group in itertools.groupby(words, lambda w: w in SEPARATORS) if not sep]
    seps = [w for w in words if w in SEPARATORS]
    out = []
    for i, part in enumerate(parts):
        argv = part[1:] if part[:1] == ["specpipe"] else part[3:] if part[:3] == ["python", "-m", "specpipe"] else None
        if argv is None:
            continue
        piped = i > 0 and seps[i - 1] == "|" and parts[i - 1][:1] == ["echo"]
        out.append(DocCommand(page, re.split(r"\s+#\s", line)[0].strip(), tuple(argv),
                              " ".join(parts[i - 1][1:]) if piped else None))
    return out


def runnable(command: DocCommand) -> bool:
    return not PLACEHOLDER.search(command.line)


COMMANDS = doc_commands()
RUNNABLE = [c for c in COMMANDS if runnable(c)]


def test_the_documented_commands_are_found():
    pages = {c.page for c in COMMANDS}
    assert {"README.md", "docs/recipes.md", "docs/training.md", "docs/gpu.md", "docs/engine.md"} <= pages, pages
    verbs = {c.argv[0] for c in COMMANDS if c.argv}
    assert {"generate", "check", "bench", "report", "tune", "train", "export", "models", "install"} <= verbs, verbs
    assert any(c.stdin for c in COMMANDS) and any("$" not in c.line and "QWEN" not in c.line for c in COMMANDS)
    assert not any("$" in arg for c in COMMANDS for arg in c.argv), "a shell variable the block does not set"
    skipped = [c.line for c in COMMANDS if not runnable(c)]
    assert len(skipped) <= 4, skipped  # placeholders only: /path/to/model.gguf, <job>


# ---- the default set: each command up to the point where its work would start ----------------------


class Resolved(BaseException):
    """Raised where the command would start its work: everything before it resolved and passed."""


def environmental(text: str) -> bool:
    """A refusal only this machine causes, saying so: no CUDA GPU, or no llama-cpp-python."""
    import torch

    no_gpu = "device=cuda" in text and not torch.cuda.is_available()
    no_llama = "specpipe install llamacpp" in text and importlib.util.find_spec("llama_cpp") is None
    return no_gpu or no_llama


@pytest.fixture
def up_to_the_work(tmp_path, monkeypatch):
    """cwd: an empty folder outside the repository; each command's work replaced by `Resolved`.
    Yields the refusals the checks made (a `check` exits 2 on them with a table, not a message)."""
    from specpipe import cli
    from specpipe.bench import runner
    from specpipe.build import config_checks
    from specpipe.checks import llamacpp
    from specpipe.checks.result import refuse_if_any
    from specpipe import build
    from specpipe.commands import bench, check, generate, install, models, report, train, tune
    from specpipe.config import conf_dir, register
    from specpipe.models import zoo
    from specpipe.pipeline import Pipeline

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert ROOT not in (outside.resolve(), *outside.resolve().parents)
    monkeypatch.chdir(outside)
    refusals: list[str] = []

    def checked(cfg, *args, **kwargs):  # what the checks refuse, recorded for `check`'s exit code 2
        checks = config_checks(cfg, fetch=False)
        refusals.extend(f"{c.name}: {c.why} {c.fix}" for c in checks if c.status == "refuse")
        return checks

    def from_config(cfg, *args, **kwargs):  # the checks loading runs first, then the weights: not those
        refuse_if_any(config_checks(cfg, fetch=False))
        raise Resolved("weights")

    def hydra_main(command, task, overrides):  # a sweep's jobs were composed and checked by check_sweep
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        flags, settings = cli._split_flags(overrides)
        if not {"-m", "--multirun"} & set(flags):  # `--cfg job`: the config Hydra would print, as Hydra reads it
            register()
            with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir()), job_name="specpipe"):
                hydra_compose(config_name=command, overrides=settings)
        raise Resolved("hydra")

    def fetch(name, **kwargs):  # a download (conftest's model cache is empty here): the work starts
        zoo._entry(name)  # an unknown name is refused as the real fetch refuses it
        raise Resolved("fetch")

    def resolved(cfg, **kwargs):  # the settings as `check` resolves them: a zoo model judged, not downloaded
        return real_resolved(cfg, fetch=False)

    real_candidates, real_resolved = tune.candidates, build.resolved
    monkeypatch.setattr(generate, "resolved", resolved)
    monkeypatch.setattr(bench, "resolved", resolved)
    monkeypatch.setattr(Pipeline, "from_config", classmethod(lambda cls, cfg, *a, **k: from_config(cfg)))
    monkeypatch.setattr(check, "config_checks", checked)
    monkeypatch.setattr(llamacpp, "measured_exact", lambda gguf, kernels: 64)  # llama.cpp's probe loads the GGUF
    monkeypatch.setattr(cli, "_hydra_main", hydra_main)
    monkeypatch.setattr(tune, "candidates", lambda cfg, err: itertools.islice(real_candidates(cfg, err), 1))
    monkeypatch.setattr(train, "resolve", lambda *a, **k: (_ for _ in ()).throw(Resolved("train")))
    monkeypatch.setattr(zoo, "fetch", fetch)
    monkeypatch.setattr(report, "report", lambda folder, **flags: (_ for _ in ()).throw(Resolved("report")))
    monkeypatch.setattr(install, "subprocess", SimpleNamespace(run=lambda *a, **k: (_ for _ in ()).throw(Resolved("install"))))
    monkeypatch.setattr(install, "built", lambda flags: False)
    monkeypatch.setattr(runner, "warm_up", lambda *a, **k: (_ for _ in ()).throw(Resolved("warm-up")))
    yield refusals


def run_up_to_the_work(command: DocCommand, refusals: list[str], capsys, monkeypatch, written: set[str]) -> str:
    """How far the command went: `Resolved`'s word (where its work starts), "done" (it ran whole:
    check, export, models) or "refused" (for what this machine lacks, said so)."""
    from specpipe import cli

    refusals.clear()
    if command.stdin is not None:
        monkeypatch.setattr(cli, "_read_stdin", lambda: command.stdin)
    try:
        code, reached = cli.main(list(command.argv)), "done"
    except Resolved as point:
        code, reached = 0, str(point)
    said = " ".join((capsys.readouterr().err + " ".join(refusals)).split())
    assert "Traceback" not in said, f"{command}\n{said}"
    if code == 2:  # refused: only for what this machine lacks, or for a folder an earlier command writes
        reasons = refusals or [said]
        assert all(environmental(reason) or any(f"={out}/" in reason for out in written) for reason in reasons), \
            f"{command}\n{said}"
        return "refused"
    assert code == 0, f"{command}\n{said}"
    return reached


def test_every_documented_command_resolves_outside_the_checkout(up_to_the_work, capsys, monkeypatch):
    failures, reached = [], {}
    for page in dict.fromkeys(c.page for c in RUNNABLE):
        written: set[str] = set()  # the out= folders of the commands before, which this set does not write
        for command in dict.fromkeys(c for c in RUNNABLE if c.page == page):
            try:
                reached[command] = run_up_to_the_work(command, up_to_the_work, capsys, monkeypatch, written)
            except AssertionError as err:
                failures.append(str(err).split("\nassert")[0])
            written |= {arg.partition("=")[2].rstrip("/") for arg in command.argv if arg.startswith("out=")}
    assert not failures, "\n\n".join(failures)
    points = {(c.argv[0], point) for c, point in reached.items()}  # each kind of command got to its work
    assert {("generate", "weights"), ("bench", "weights"), ("bench", "hydra"), ("tune", "fetch"), ("train", "train"),
            ("report", "report"), ("models", "fetch"), ("install", "install"), ("export", "done"),
            ("check", "done")} <= points, points


@pytest.mark.parametrize("argv", [("generate", "recipe=recipes/no-such-model"), ("generate", "gama=4"),
                                  ("bench", "prompts=no-such-set"), ("tune", "strategies=[no-such]"),
                                  ("export", "vllm", "proposer=no-such"), ("report", "plot=maybe")])
def test_a_command_that_would_not_run_as_documented_fails_here(up_to_the_work, capsys, monkeypatch, argv):
    with pytest.raises(AssertionError):
        run_up_to_the_work(DocCommand("a page", "specpipe " + shlex.join(argv), argv), up_to_the_work, capsys,
                           monkeypatch, set())


def test_a_documented_path_that_is_missing_says_where_it_was_looked_for(up_to_the_work, capsys):
    from specpipe import cli

    for args, missing in ((["generate", "prompt_file=recipes/NO-SUCH.md"], "recipes/NO-SUCH.md"),
                          (["generate", "recipe=recipes/no-such-model"], "recipes/no-such-model"),
                          (["train", "proposer=eagle", "init=recipes/no-such-model/eagle"], "recipes/no-such-model/eagle")):
        assert cli.main(args) == 2
        said = "".join(capsys.readouterr().err.split())  # rich wraps a long path anywhere
        assert "".join(f"{Path.cwd() / missing}".split()) in said and f"{ROOT / missing}" in said, said


# ---- -m full: every command for real -------------------------------------------------------------


@pytest.mark.full  # decodes, benches, tunes and trains as documented: hours on a CPU
@pytest.mark.slow  # the real models, fetched as the pages say
@pytest.mark.parametrize("page", sorted({c.page for c in RUNNABLE}))
def test_every_documented_command_runs_for_real_outside_the_checkout(page, tmp_path):
    import torch

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    for command in [c for c in RUNNABLE if c.page == page]:
        if "device=cuda" in command.argv and not torch.cuda.is_available():
            continue  # docs/gpu.md's commands: on a GPU
        result = subprocess.run([sys.executable, "-m", "specpipe", *command.argv], cwd=folder, capture_output=True,
                                text=True, input=command.stdin, env={**os.environ, "COLUMNS": "200"})
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
