"""Where specpipe's shipped files are: a leaf, so the lowest modules can find them."""

from __future__ import annotations

from pathlib import Path


def shipped_dir(name: str, holding: str | None = None) -> Path | None:
    """A folder specpipe ships beside its code (conf/, strategies/, recipes/): the copy installed
    inside the package, else the source checkout's; holding: a file it must hold. None: neither."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent / name):
        if candidate.is_dir() and (holding is None or (candidate / holding).exists()):
            return candidate
    return None


def conf_dir() -> Path:
    """conf/ of a source checkout, or the copy installed inside the package."""
    found = shipped_dir("conf", "generate.yaml")
    if found is None:
        raise FileNotFoundError("specpipe's conf/ directory is missing from this installation")
    return found


def project_root() -> Path | None:
    """The checkout specpipe runs from (an editable install's too), or None for an installed copy."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def project_path(path: str | Path) -> Path | None:
    """A relative path as the docs write it (`recipes/README.md`, from the project's root), inside the
    checkout specpipe runs from; None where there is nothing there or no checkout. Looked at only
    after the working directory: a user's own file of that name wins."""
    path, root = Path(path).expanduser(), project_root()
    if path.is_absolute() or root is None:
        return None
    return root / path if (root / path).exists() else None


def looked_at(path: str | Path) -> str:
    """Where a relative path was looked for (the working directory, then the project's root), as an
    error names them."""
    path, root = Path(path).expanduser(), project_root()
    places = dict.fromkeys([path.resolve(), *([root / path] if root is not None and not path.is_absolute() else [])])
    return " and at ".join(map(str, places))
