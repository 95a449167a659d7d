"""What is wrong with a heads folder's weights, found from their headers before anything reads them.

A heads folder comes from `specpipe train`, a recipe, or a stranger (speculators' EAGLE-3 heads):
like a model directory (models/integrity.py), its files are checked by structure, so a
truncated, emptied, overwritten or header-corrupted `model.safetensors` is named with what is
wrong before `check` says ok, before `export` writes a config for it, and before a load meets
safetensors' own error. Beyond the model check (the header parses, the data ends inside the
file) each tensor's byte span must be what its dtype and shape need and lie inside the data.

Every check returns None when intact, else one phrase saying what is wrong (for a message).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from specpipe.models.integrity import safetensors_problem

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"  # transformers' index of a sharded checkpoint
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def weight_files(folder: Path) -> tuple[list[str], str | None]:
    """(the weight files a heads folder holds: `model.safetensors`, or the shards its index names;
    a phrase when the index itself is unreadable)."""
    index = Path(folder) / INDEX
    if not index.exists():
        return [WEIGHTS], None
    try:
        shards = json.loads(index.read_text())["weight_map"].values()
        return sorted({str(s) for s in shards}), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], f"{INDEX} is not a readable index (no weight_map)"


def heads_problem(folder: Path | str) -> str | None:
    """Every weight file of a heads folder present and whole, or what is wrong with the first that is not."""
    folder = Path(folder)
    files, problem = weight_files(folder)
    if problem:
        return problem
    if missing := [name for name in files if not (folder / name).is_file()]:
        return f"it lacks {', '.join(missing)}"
    for name in files:
        problem = safetensors_problem(folder / name) or _tensor_spans_problem(folder / name)
        if problem:
            return problem
    return None


def _tensor_spans_problem(path: Path) -> str | None:
    """Each tensor's [begin, end) inside the data and as long as its dtype and shape need (a header
    can parse and still point a tensor at bytes it does not have)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = path.stat().st_size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
            need = math.prod(int(d) for d in entry["shape"]) * _DTYPE_BYTES[entry["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"{path.name} has a corrupt header entry for {name!r} (its dtype, shape or offsets)"
        if not 0 <= begin <= end <= data or end - begin != need:
            return (f"{path.name}'s tensor {name!r} needs {need:,} bytes at [{begin:,}, {end:,}) of {data:,} bytes "
                    "of data (corrupt header)")
    return None


def shape_problem(what: str, key: str, theirs, target) -> str | None:
    """A heads config's number against the target's, like with like: a value that is not an integer
    is named as such (its text would print the same as the target's number)."""
    ours = getattr(target, key, None)
    if not isinstance(theirs, int) or isinstance(theirs, bool):
        return f"{what}: the heads' config.json has {key}={theirs!r}, which is not an integer (the target's is {ours})"
    return None if theirs == ours else f"{what} {theirs} vs the target's {ours}"
