"""Where specpipe's shipped files are: a leaf, so the lowest modules can find them."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    """conf/ of a source checkout, or the copy installed inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "generate.yaml").exists():
            return candidate
    raise FileNotFoundError("specpipe's conf/ directory is missing from this installation")
