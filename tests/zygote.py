"""`python -m specpipe ...` as a user runs it, without paying its imports each time.

Each command the CLI tests run spent ~2 s importing torch, transformers, Hydra and specpipe
before doing anything (the CLI, hardening and stranger-input tests' 53 commands: 159 s spawned,
62 s forked, on 2 cores). A zygote (Android's name for the trick) imports them once and forks a
child for each command: the child is still its own process, with its own exit code, output
files, working directory and environment, starting from the state of a fresh interpreter that
has imported those modules.

A variable that a library reads once at import (HF_*, TORCH*, PYTHON*, ...) cannot be changed in
a forked child, so a command whose environment differs from the zygote's in anything other than
FORKABLE's prefixes, read at run time, runs as a real subprocess. `SPECPIPE_TEST_SPAWN=1` runs
every command as a real subprocess.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

FORKABLE = ("SPECPIPE_", "PIP_", "COLUMNS", "PYTEST_")  # read at run time: a forked child may differ in them
PRELOAD = ("torch", "transformers", "hydra", "specpipe.cli", "specpipe.pipeline", "specpipe.build",
           "specpipe.commands.generate", "specpipe.commands.check", "specpipe.commands.bench",
           "specpipe.commands.export", "specpipe.commands.tune")

# The zygote: requests (one JSON line each) on fd 0, replies on fd 1 (the child's pid, then its
# exit code). Each child swaps those fds for /dev/null and its own output files.
SERVER = r"""
import atexit, importlib, json, os, runpy, sys, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
requests, replies = os.fdopen(os.dup(0), "r"), os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0); os.dup2(null, 1)
sys.stdout.flush(); sys.stderr.flush()
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        requests.close(); os.close(replies)
        os.dup2(os.open(job["out"], os.O_WRONLY), 1); os.dup2(os.open(job["err"], os.O_WRONLY), 2)
        os.chdir(job["cwd"]); os.environ.clear(); os.environ.update(job["env"])
        sys.argv = ["specpipe", *job["args"]]
        code = 0
        try:
            runpy.run_module("specpipe", run_name="__main__", alter_sys=True)
        except SystemExit as stop:  # what the interpreter does with it
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(code)
    os.write(replies, f"{pid}\n".encode())
    os.write(replies, f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n".encode())
"""


class Zygote:
    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.unread = b""  # of its replies (read from the pipe's fd: a buffered reader would hide them from select)

    def forks(self, env: dict[str, str]) -> bool:
        if os.environ.get("SPECPIPE_TEST_SPAWN") == "1":
            return False
        base = self.env or os.environ  # the zygote's, or the one it will start with
        return all(env.get(k) == base.get(k) or k.startswith(FORKABLE) for k in set(env) | set(base))

    def run(self, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        if self.process is None or self.process.poll() is not None:
            self.env = dict(os.environ)
            self.process = subprocess.Popen([sys.executable, "-c", SERVER, *PRELOAD], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, env=self.env, text=True, bufsize=1)
            self.unread = b""
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "out", Path(folder) / "err"
            out.touch(), err.touch()
            job = {"args": args, "env": env, "cwd": os.getcwd(), "out": str(out), "err": str(err)}
            self.process.stdin.write(json.dumps(job) + "\n")
            pid = int(self._reply(None))
            try:
                code = int(self._reply(timeout))
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)  # not reaped yet: the zygote replies once it has waited for it
                self._reply(None)
                raise subprocess.TimeoutExpired(args, timeout) from None
            return subprocess.CompletedProcess([sys.executable, "-m", "specpipe", *args], code,
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))

    def _reply(self, timeout: float | None) -> str:
        """The zygote's next reply line, waiting at most `timeout` seconds for it (None: no limit)."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self.unread:
            if not select.select([fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("zygote", timeout)
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the test zygote exited")
            self.unread += chunk
        line, self.unread = self.unread.split(b"\n", 1)
        return line.decode()


ZYGOTE = Zygote()


def specpipe(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m specpipe *args` with `env` added to this process's environment (and COLUMNS=200)."""
    full = {**os.environ, "COLUMNS": "200", **(env or {})}
    if not ZYGOTE.forks(full):
        return subprocess.run([sys.executable, "-m", "specpipe", *args], capture_output=True, text=True,
                              timeout=timeout, env=full)
    return ZYGOTE.run(list(args), full, timeout)
