"""What a file from a stranger (a recipe, a strategy) may hold beyond its schema: values are
data, never interpolated, and the paths it names stay inside its own folder (a zoo name or a
hub id excepted). recipe.py checks each value of such a file through these two rules.
"""

from __future__ import annotations

import re
from pathlib import Path

from specpipe.errors import SpecpipeError

PATH_OPTIONS = {"proposer.model", "proposer.heads", "proposer.fallback_model"}  # options that name a model or a folder
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # org/name, or a bare name


def refuse_interpolation(key: str, value, where: str) -> None:
    """`${...}` in a stranger's value would be resolved by Hydra (`${oc.env:SECRET}` reads the
    environment): data from a file is never interpolated, so such a value is refused by name."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and "${" in item:
            raise SpecpipeError(f"{where}: {key}={item!r} holds an interpolation (`${{...}}`), which a recipe or "
                                "strategy may not use: its values are data, never resolved. Write the value "
                                "itself, or pass the setting on the command line.")


def _path_like(key: str, value: str) -> bool:
    return (key in PATH_OPTIONS or key == "target" or "/" in value or "\\" in value
            or value.startswith((".", "~")) or value.endswith((".gguf", ".json", ".jsonl", ".safetensors")))


def confine(key: str, value: str, folder: Path, where: str, fix: str = "") -> str:
    """A path-shaped value of a stranger's file: a path inside `folder` (made absolute), a zoo
    name or a hub id (unchanged); anything else (absolute, `~`, `..` out of the folder, a local
    path outside it) is refused by name."""
    from specpipe.models import zoo

    if not _path_like(key, value) or value in zoo.ZOO:
        return value
    folder = folder.resolve()
    inside = (folder / value).resolve() if not Path(value).expanduser().is_absolute() else None
    if inside is not None and folder in (inside, *inside.parents) and inside.exists():
        return str(inside)
    if _HUB_ID.match(value) and ".." not in value and not Path(value).exists():
        return value  # a hub id (nothing of that name here, where the loader would look first)
    raise SpecpipeError(f"{where}: {key}={value!r} points outside the file's folder {folder}: a recipe or "
                        "strategy may name only files inside its own folder, zoo models or hub ids. Copy the "
                        f"file into {folder} (a recipe lists it under artifacts:){', ' + fix if fix else ''}.")
