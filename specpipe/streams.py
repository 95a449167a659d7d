"""The standard streams, guarded for the command line: every write to stdout and stderr (print,
`sys.stdout.write`, rich) goes through one wrapper, so each way a stream can fail ends the same way.

- closed before the run (`>&-`, `<&-` where `-` reads a prompt) or opened read-only: refused
  before any work (a SpecpipeError, exit 2). A closed descriptor is first plugged with
  /dev/null, so no file opened later lands on it and catches writes meant for the terminal.
- a broken pipe (`| head -c 10`): the run stops quietly at the first write that fails, and the
  process ends by SIGPIPE, as `cat` or `yes` do (a shell reports 141).
- any other write error (`> /dev/full`): one `error:` line on stderr, exit 1, as `echo` does.
- an encoding that cannot show a character (`PYTHONIOENCODING=ascii`): the text is written with
  `\\uXXXX` escapes instead, and one warning says so and how to see it whole.

Not here: files a command writes (outputs.py), what is printed (the commands).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys

from specpipe.errors import SpecpipeError

EXIT_WRITE_FAILED = 1


class StreamFailed(Exception):
    """A write to stdout or stderr failed (not an OSError: nothing that handles a file's errors catches it)."""

    def __init__(self, name: str, err: OSError):
        super().__init__(f"{name}: {err}")
        self.name, self.err = name, err

    @property
    def broken_pipe(self) -> bool:
        return isinstance(self.err, BrokenPipeError)


class Guarded:
    """A text stream whose write errors become StreamFailed and whose unencodable text is escaped."""

    def __init__(self, inner, name: str):
        self._inner, self._name, self._warned = inner, name, False

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except UnicodeEncodeError:
            self._warn_encoding()
            encoding = self._inner.encoding or "ascii"
            return self._call(self._inner.write, text.encode(encoding, "backslashreplace").decode(encoding))
        except OSError as err:
            raise StreamFailed(self._name, err) from None

    def flush(self) -> None:
        self._call(self._inner.flush)

    def _call(self, method, *args):
        try:
            return method(*args)
        except OSError as err:
            raise StreamFailed(self._name, err) from None

    def _warn_encoding(self) -> None:
        if self._warned:
            return
        self._warned = True
        encoding = self._inner.encoding
        with contextlib.suppress(Exception):
            sys.__stderr__.write(f"warning: {self._name}'s encoding ({encoding}) cannot show some characters; they "
                                 "are written as \\uXXXX escapes. Set PYTHONIOENCODING=utf-8 (or a UTF-8 locale) to "
                                 "see them as they are.\n")
            sys.__stderr__.flush()

    def __getattr__(self, name):  # isatty, encoding, fileno, ... as the stream has them
        return getattr(self._inner, name)


def _plug(fd: int) -> bool:
    """Whether `fd` was closed; if so /dev/null now holds its number."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        return True


def _writable(stream) -> bool:
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return True  # not a descriptor (a test's capture): nothing to check
    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
    except OSError:
        return False


_stdin_closed = False  # fd 0 was closed when the command started


def stdin_closed() -> bool:
    return sys.stdin is None or _stdin_closed


@contextlib.contextmanager
def guarded():
    """stdout and stderr guarded for the block; a closed or read-only stdout refused first."""
    global _stdin_closed
    closed = {fd: _plug(fd) for fd in (0, 1, 2)}
    _stdin_closed = closed[0]
    saved = sys.stdout, sys.stderr
    if closed[2] or sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # nowhere to say anything: the exit code still tells
    if sys.stdout is None or closed[1] or not _writable(sys.stdout):
        raise SpecpipeError("Standard output is closed or not writable, so nothing specpipe prints could be seen. "
                            "Nothing was run: give the command an output (a terminal, a pipe, a file, or "
                            "`> /dev/null` to discard it).")
    if not isinstance(sys.stdout, Guarded):
        sys.stdout = Guarded(sys.stdout, "standard output")
    if not isinstance(sys.stderr, Guarded):
        sys.stderr = Guarded(sys.stderr, "standard error")
    try:
        yield
        sys.stdout.flush()  # block-buffered in a pipe or file: the last writes fail here, if anywhere
        sys.stderr.flush()
    finally:
        sys.stdout, sys.stderr = saved


def ended(err: StreamFailed) -> int:
    """What the process does when a stream failed: a broken pipe ends it by SIGPIPE; anything
    else is one `error:` line on stderr (if stderr still takes it) and EXIT_WRITE_FAILED."""
    for fd in (1, 2):  # what is still buffered for the failed stream goes nowhere, quietly
        if _failed(fd, err):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    if err.broken_pipe:
        with contextlib.suppress(Exception):
            sys.__stderr__.flush()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    with contextlib.suppress(Exception):
        sys.__stderr__.write(f"error: {err.name} cannot be written ({err.err.strerror or err.err}). Point it at a "
                             "terminal, a pipe or a file with room, and run the command again.\n")
        sys.__stderr__.flush()
    return EXIT_WRITE_FAILED


def _failed(fd: int, err: StreamFailed) -> bool:
    """Whether `fd` is (or shares its pipe or file with) the stream that failed."""
    failed = 1 if err.name == "standard output" else 2
    try:
        return fd == failed or os.path.samestat(os.fstat(fd), os.fstat(failed))
    except OSError:
        return True
