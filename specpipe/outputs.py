"""Where commands write: checked before the work starts, and never lost after it.

- `writable_output(folder, setting)`: before any model loads, the folder is created if missing
  and a nameless probe file written in it, so a bad `out=` costs seconds, not a run.
- `save_or_keep(write, path, what)`: after the work. If writing to `path` fails anyway (the
  disk filled, the folder was removed or made read-only meanwhile), the same write goes to a
  fresh folder under the specpipe cache (else the system temp dir) and the error names it.
- `atomic_write(path, dump)`: a temporary file beside `path` renamed into place; it is removed
  if anything fails, so neither half a file nor a stray temporary one is ever left.
- `SweepPreflight`: the same check for a `-m` sweep's folder, before Hydra creates it.
- `remove_unused_folders()`: after a refusal, the folders those checks made that are still empty
  go again (the CLI calls it): a refused command leaves no empty `out=` or `work=` behind.

One rule for what a command would write over: nothing measured or trained is lost silently.
- a measurement or a recipe (bench's results.json, an interrupted run's results.partial.json,
  tune's specpipe.yaml) is never replaced: `keep_aside(path)` renames the older file with its
  date (results-20261207-101500.json) and the command names it; tune's `overwrite=true` replaces
  the recipe instead;
- trained heads and their recipe (train's: a folder the recipe names, which a dated copy of the
  recipe would not follow) are replaced only with `overwrite=true`: `refuse_replacing` refuses
  before any work otherwise, since with the default out=recipes in a checkout they are shipped.

Not here: what a result depends on (bench/results.py `measured_with`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from hydra.experimental.callback import Callback

from specpipe.errors import SpecpipeError, report


def writable_output(folder: Path, setting: str, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()) -> Path:
    """`folder`, created if missing and proven writable; `files` and `folders` in it, where they
    exist already, must be of that kind. `setting` is the user's setting, `out=...`."""
    folder, key = Path(folder), setting.partition("=")[0]
    missing = [part for part in (folder, *folder.parents) if not part.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if missing:
            CREATED.append(missing[-1])  # the outermost folder this check made
        with tempfile.TemporaryFile(dir=folder, prefix=".specpipe-probe-"):
            pass  # nameless on Linux (O_TMPFILE), else removed at once: the probe leaves nothing
    except OSError as err:
        raise SpecpipeError(f"{_where(setting, folder)} cannot be written ({why(folder, err)}). Nothing was run: "
                            f"point {key}= somewhere writable.") from None
    for name, want_folder in [*((f, False) for f in files), *((f, True) for f in folders)]:
        path = folder / name
        if path.exists() and path.is_dir() != want_folder:
            raise SpecpipeError(f"{_where(setting, path)} is a {'file' if want_folder else 'folder'}, where specpipe "
                                f"writes a {'folder' if want_folder else 'file'}. Nothing was run: move it away or "
                                f"point {key}= elsewhere.")
    return folder


CREATED: list[Path] = []  # folders writable_output made in this process, outermost first


def remove_unused_folders() -> None:
    """After a refusal: the folders `writable_output` made that nothing was written into go again,
    so a command that says "nothing was run" leaves nothing behind (a folder holding anything stays)."""
    while CREATED:
        top = CREATED.pop()
        for folder in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: len(p.parts),
                             reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty one: never a file, nor a folder holding one


def _where(setting: str, path: Path) -> str:
    return setting if setting.endswith(f"={path}") else f"{setting}: {path}"


def save_or_keep(write: Callable[[Path], Path], path: Path, what: str) -> Path:
    """`write(path)`; if that fails, `write` to a fallback path (same name) and a SpecpipeError
    naming it, so what took minutes to measure survives a destination gone bad."""
    try:
        return write(path)
    except OSError as err:
        problem = f"Could not write {what} to {path} ({why(path, err)})"
    tried = []
    for root in fallback_roots():
        spot = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            spot = Path(tempfile.mkdtemp(dir=root, prefix=time.strftime("%Y%m%d-%H%M%S-")))  # never over another
            kept = write(spot / path.name)
        except OSError as err:
            if spot:
                shutil.rmtree(spot, ignore_errors=True)
            tried.append(f"{root} ({why(root, err)})")
            continue
        raise SpecpipeError(f"{problem}. Kept instead at {kept}, so nothing is lost: move that where it belongs "
                            "once the destination is writable.")
    raise SpecpipeError(f"{problem}, nor to {' or '.join(tried)}. Free some space or fix the permissions, then "
                        "run the command again.")


KEPT_ASIDE = re.compile(r"-\d{8}-\d{6}(-\d+)?(\.\w+)?$")  # the end of a name keep_aside gave


def keep_aside(path: Path) -> Path:
    """Rename the file at `path` to `<stem>-<its date><suffix>` beside it (never over another
    kept one); the new path. results.partial.json becomes results.partial-20261207-101500.json."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    stem, suffix = (path.name[: -len(path.suffix)], path.suffix) if path.suffix else (path.name, "")
    aside, n = path.with_name(f"{stem}-{stamp}{suffix}"), 1
    while aside.exists():
        aside, n = path.with_name(f"{stem}-{stamp}-{n}{suffix}"), n + 1
    path.rename(aside)
    return aside


def refuse_replacing(paths: list[Path], overwrite: bool, what: str) -> None:
    """Before any work: `paths` that exist (a recipe, heads) are another run's, maybe the shipped
    ones, and are replaced only with overwrite=true."""
    earlier = [path for path in map(Path, paths) if path.exists()]
    if earlier and not overwrite:
        raise SpecpipeError(f"{earlier[0]} exists already, and this run would replace it with {what}. Nothing was "
                            "run: pass out=ANOTHER_FOLDER to keep both, or overwrite=true to replace it.")


def fallback_roots() -> list[Path]:
    """Where `save_or_keep` keeps what its destination refused, first choice first."""
    from specpipe.models.zoo import cache_root

    return [cache_root() / "unsaved", Path(tempfile.gettempdir()) / "specpipe-unsaved"]


def atomic_write(path: Path, dump: Callable[[IO[str]], None]) -> Path:
    """`dump(file)` into a temporary file in `path`'s folder, then renamed to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".specpipe-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w") as f:
            dump(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are meant to be read
        os.replace(tmp, path)
    except BaseException:  # an interrupt too: never a stray temporary file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def why(path: Path, err: OSError) -> str:
    """The reason in words: a file standing where a folder is needed, else the system's."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists():
            if part.is_file() and (part != path or isinstance(err, FileExistsError)):
                return f"{part} is a file, not a folder"
            break
    return err.strerror or str(err)


class SweepPreflight(Callback):
    """`-m`: the sweep's folder must be writable before Hydra creates it (and runs any job)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            writable_output(Path(config.hydra.sweep.dir), f"out={config.get('out', config.hydra.sweep.dir)}")
        except SpecpipeError as err:
            sys.exit(report(err))
