"""The standard streams, as a shell hands them over: closed, a pipe whose reader has gone, a full
device, an encoding that cannot show the text. Each case is one process (real, not forked: the
descriptors are the point) through the one guard every write goes through (specpipe/streams.py),
and each command kind meets it: a decode's stream of text, a JSON document, a rich table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from specpipe import streams
from test_cli import model_dirs  # noqa: F401  (a fixture)

QUICK = ["max_new_tokens=4", "proposer=ngram", "baseline=false"]


def run(args: list[str], *, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env: dict | None = None,
        close: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m specpipe ARGS` with `close` descriptors closed in the child (as `>&-` does)."""
    def closing():
        for fd in close:
            os.close(fd)

    return subprocess.run([sys.executable, "-m", "specpipe", *args], stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120", **(env or {})},
                          preexec_fn=closing, timeout=300, text=True)


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return " ".join(stderr[stderr.index("error:"):].split())


@pytest.mark.parametrize("args", [["generate", "w5 w9", "output=json"], ["generate", "w5 w9", "output=text"],
                                  ["check"]])
def test_a_closed_stdout_is_refused_before_any_work(model_dirs, args):  # noqa: F811
    result = run([*args, f"model={model_dirs / 'target'}", *QUICK], stdout=None, close=(1,))
    assert result.returncode == 2  # never 0 with nothing written
    assert "Standard output is closed" in one_error(result.stderr) and "Nothing was run" in result.stderr
    assert "Loading" not in result.stderr  # no weights were read


def test_a_read_only_stdout_is_refused_before_any_work(model_dirs):  # noqa: F811
    with open(os.devnull) as read_only:
        result = run(["generate", "w5 w9", f"model={model_dirs / 'target'}", "output=json", *QUICK], stdout=read_only)
    assert result.returncode == 2 and "not writable" in one_error(result.stderr)


def test_a_closed_stdin_is_refused_where_a_prompt_is_read_from_it(model_dirs):  # noqa: F811
    result = run(["generate", "-", f"model={model_dirs / 'target'}", "output=json", *QUICK], stdin=None, close=(0,))
    assert result.returncode == 2 and "standard input is closed" in one_error(result.stderr)


@pytest.mark.parametrize("args", [["generate", "w5 w9 w5 w9", "output=text", "max_new_tokens=40"],
                                  ["generate", "w5 w9", "output=json"], ["models"]])
def test_a_broken_pipe_ends_quietly_by_sigpipe(model_dirs, args, tmp_path):  # noqa: F811
    """The reader is gone before the first write (as `| head -c 10` is once it has its bytes):
    the process stops at that write and ends as `cat` does, killed by SIGPIPE (a shell says 141)."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = run([*args, f"model={model_dirs / 'target'}", *QUICK] if args[0] != "models" else args,
                     stdout=write, env={"SPECPIPE_CACHE": str(tmp_path)})
    finally:
        os.close(write)
    assert result.returncode == -signal.SIGPIPE, result.stderr
    assert "Traceback" not in result.stderr and "error" not in result.stderr.lower(), result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args", [["generate", "w5 w9", "output=text"], ["check"]])
def test_a_full_stdout_is_one_error_line_and_exit_1(model_dirs, args):  # noqa: F811
    with open("/dev/full", "w") as full:
        result = run([*args, f"model={model_dirs / 'target'}", *QUICK], stdout=full)
    assert result.returncode == streams.EXIT_WRITE_FAILED
    assert "standard output cannot be written (No space left on device)" in one_error(result.stderr)


def test_an_ascii_stdout_gets_escapes_and_one_warning(model_dirs):  # noqa: F811
    # the rich summary holds τ and ·, which ASCII cannot show
    result = run(["generate", "w5 w9", f"model={model_dirs / 'target'}", "max_new_tokens=4", "proposer=ngram"],
                 env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "\\u03c4" in result.stdout
    assert result.stderr.count("cannot show some characters") == 1 and "PYTHONIOENCODING=utf-8" in result.stderr
