"""`specpipe install llamacpp`: build llama-cpp-python for `engine=llamacpp` with flags that work here.

llama-cpp-python ships as source and compiles llama.cpp on install (a few minutes on 2 cores).
Its default is a native build (`GGML_NATIVE`: every instruction set of the building CPU). On
Intel CPUs with AMX that build loads models but crashes at its first evaluation, so there the
command builds for AVX2/FMA/F16C instead. llamafile's batched matmul (`GGML_LLAMAFILE`) is
switched off: with it ggml evaluates a block of several tokens with other kernels than one
token, so a verify block's rows would not equal plain decoding's; without it they do (measured
by `specpipe check engine=llamacpp`). A user's own `CMAKE_ARGS` wins: the command then prints
what it uses and passes them on unchanged. A build it made is recorded (version and flags, in the
cache): run again with the same, it says so and builds nothing; `--force` builds anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rich.console import Console

from specpipe.errors import SpecpipeError
from specpipe.machine import cpu_features
from specpipe.markup import esc

USAGE = ("usage: specpipe install llamacpp [--print|--force]   build llama-cpp-python for engine=llamacpp "
         "(--print: show the command only; --force: build again although this build is installed; set "
         "CMAKE_ARGS to choose other build flags)")
RECORD = "llamacpp-build.json"  # in the cache: the version and flags of the last build this command made
EXACT = "-DGGML_LLAMAFILE=OFF"  # one kernel for one token and for a block: verify rows equal plain rows
PORTABLE = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"  # where the native build crashes


def build_flags(features: tuple[str, ...], user: str | None) -> tuple[str, str]:
    """(CMAKE_ARGS, why) for a CPU with `features` (machine.cpu_features), or the user's own."""
    if user:
        return user, "CMAKE_ARGS as set in the environment"
    if "amx" in features:
        return f"{PORTABLE} {EXACT}", ("this CPU has AMX, where llama.cpp's native build crashes at its first "
                                       "evaluation: built for AVX2/FMA/F16C")
    return f"{EXACT}", "a native build for this CPU"


def commands() -> list[list[str]]:
    """The build itself (forced: pip keys its wheel cache by the source archive, not by CMAKE_ARGS,
    and keeps an installed copy of the same version), then its small dependencies."""
    from specpipe.engine.llamacpp import PINNED

    pip = [sys.executable, "-m", "pip", "install"]
    package = f"llama-cpp-python=={PINNED}"
    return [[*pip, "--no-cache-dir", "--force-reinstall", "--no-deps", package], [*pip, package]]


def _record():
    from specpipe.models.zoo import cache_root

    return cache_root() / RECORD


def built(flags: str) -> bool:
    """Whether the installed llama-cpp-python is the pinned version this command built with `flags`."""
    from importlib.metadata import PackageNotFoundError, version

    from specpipe.engine.llamacpp import PINNED

    try:
        return version("llama_cpp_python") == PINNED and json.loads(_record().read_text()) == {
            "version": PINNED, "cmake_args": flags}
    except (OSError, ValueError, PackageNotFoundError):
        return False


def run(args: list[str]) -> int:
    if args in ([], ["-h"], ["--help"]) or args[0] != "llamacpp" or args[1:] not in ([], ["--print"], ["--force"]):
        if args in (["-h"], ["--help"]):
            print(USAGE)
            return 0
        raise SpecpipeError(f"`specpipe install {' '.join(args)}` is not an install command. {USAGE}")
    flags, why = build_flags(cpu_features(), os.environ.get("CMAKE_ARGS"))
    err = Console(stderr=True)
    err.print(f"CMAKE_ARGS=\"{esc(flags)}\" ({why}); change them by setting CMAKE_ARGS and running this again.")
    for line in commands():
        err.print(esc(" ".join(line)))
    if args[1:] == ["--print"]:
        return 0
    if args[1:] != ["--force"] and built(flags):  # the README runs it before each engine=llamacpp example
        err.print("[green]llama-cpp-python is installed[/green], built by this command with these flags: nothing to "
                  "do (`specpipe install llamacpp --force` builds it again).")
        return 0
    err.print("[dim]Building llama.cpp from source: a few minutes.[/dim]")
    for line in commands():
        done = subprocess.run(line, env={**os.environ, "CMAKE_ARGS": flags, "FORCE_CMAKE": "1"})
        if done.returncode != 0:
            raise SpecpipeError(f"pip could not install llama-cpp-python (exit {done.returncode}; its output is "
                                "above). The build needs a C++ compiler and cmake (e.g. apt install build-essential "
                                "cmake); other build flags can be set with CMAKE_ARGS.")
    from specpipe.engine.llamacpp import PINNED
    from specpipe.outputs import atomic_write

    try:  # what a later run compares: the same version and flags are not built again
        atomic_write(_record(), lambda f: f.write(json.dumps({"version": PINNED, "cmake_args": flags})))
    except OSError:
        pass  # no record: the next run builds again, nothing worse
    err.print("[green]llama-cpp-python installed[/green]: `specpipe check engine=llamacpp` measures its guarantee here.")
    return 0
