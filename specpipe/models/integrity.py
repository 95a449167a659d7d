"""What is wrong with a model file or folder, found cheaply, before transformers reads it.

Two kinds of check, one per origin:
- what specpipe wrote itself (a fetched GGUF, a dense safetensors cache) carries a record of how
  it looked when it was known good: a `.verified` sidecar (sha256, size, mtime) for a file, a
  manifest (file sizes) for a folder. A use compares the record with `stat()`, so a later
  truncation or rewrite is caught without hashing a gigabyte on every load; a folder's weights
  headers and JSON files are read too (a few kB), so damage inside a file's size is caught where
  loading would fail on it. Damage to tensor data alone is not.
- what a user hands over (a `.gguf` file, a model directory) is checked by its structure:
  the GGUF header and tensor table must fit the file, a directory must hold a config with a
  `model_type`, weights whose safetensors headers fit their files, and a tokenizer.

Every check returns None when intact, else one phrase saying what is wrong (for a message).
It is not a loader and decides nothing about refetching or rebuilding: callers do.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "specpipe-manifest.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_CHUNK = 1 << 20

# ---- files with a known sha256 (fetched GGUFs) -----------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    """Whole or absent, never half: two writers (processes or threads) each use their own temp file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # still there only if the write failed


def marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path, sha256: str) -> dict:
    st = path.stat()
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def mark_verified(path: Path, sha256: str) -> None:
    """Record that `path`, as it is now, has `sha256`; best effort (a read-only cache stays usable)."""
    with contextlib.suppress(OSError):
        _write_atomically(marker(path), json.dumps(_stamp(path, sha256)))


def file_problem(path: Path, size: int, sha256: str) -> str | None:
    """`path` against its expected size (every call) and sha256 (only if it changed since verified)."""
    if not path.is_file():
        return "it is not a regular file"
    actual_size = path.stat().st_size
    if actual_size != size:
        return f"it is {actual_size:,} bytes, expected {size:,} (truncated or replaced)"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker(path).read_text()) == _stamp(path, sha256):
            return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        return f"its sha256 is {digest.hexdigest()}, expected {sha256} (corrupted)"
    mark_verified(path, sha256)
    return None


# ---- GGUF files --------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_HEADER = 24  # magic, version, tensor count, metadata count


class _Cursor:
    """Reads GGUF fields in order; struct.error once a field runs past the end of the file."""

    def __init__(self, buf, order: str):
        self.buf, self.order, self.pos = buf, order, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def value(self, vtype: int):
        if vtype == _GGUF_STRING:
            (n,) = self.take("Q")
            self.pos += n
            if self.pos > len(self.buf):
                raise struct.error("a string runs past the end of the file")
            return bytes(self.buf[self.pos - n:self.pos])
        if vtype == _GGUF_ARRAY:
            etype, count = self.take("IQ")
            if etype in _GGUF_SCALARS:  # skipped whole: vocabularies are arrays of 150k entries
                self.pos += count * struct.calcsize(self.order + _GGUF_SCALARS[etype])
            else:
                for _ in range(count):
                    self.value(etype)
            return None
        return self.take(_GGUF_SCALARS[vtype])[0]  # KeyError: not a GGUF value type


def _gguf_table(cur: _Cursor) -> tuple[set[bytes], int, int]:
    """(metadata keys, tensor count, bytes the file must have: metadata and tensor table,
    aligned, then up to the end of the farthest tensor's data)."""
    from gguf.constants import GGML_QUANT_SIZES

    _, _, n_tensors, n_kv = cur.take("4sIQQ")
    keys, alignment = set(), 32
    for _ in range(n_kv):
        key = cur.value(_GGUF_STRING)
        value = cur.value(cur.take("I")[0])
        keys.add(key)
        if key == b"general.alignment":
            alignment = value
    end = 0
    for _ in range(n_tensors):
        cur.value(_GGUF_STRING)
        (n_dims,) = cur.take("I")
        dims = cur.take(f"{n_dims}Q")
        ggml_type, offset = cur.take("IQ")
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        end = max(end, offset + math.prod(dims) // block * type_size)
    return keys, n_tensors, -(-cur.pos // alignment) * alignment + end


def gguf_problem(path: Path) -> str | None:
    """Header, metadata and tensor table of a GGUF file, and that its tensor data fits (~0.3 s)."""
    size = path.stat().st_size
    if size < _GGUF_HEADER:
        return "it is empty (0 bytes)" if size == 0 else f"it is only {size} bytes, less than a GGUF header"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            return f"it does not start with the GGUF magic bytes (it starts with {bytes(buf[:4])!r})"
        # a version whose low half is 0 was written big-endian
        order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
        (version,) = struct.unpack_from(order + "I", buf, 4)
        if version not in (2, 3):
            return f"it is GGUF version {version}; transformers reads versions 2 and 3"
        try:
            keys, n_tensors, need = _gguf_table(_Cursor(buf, order))
        except (struct.error, KeyError, TypeError, ValueError, ArithmeticError, MemoryError):
            return "its metadata or tensor table is cut short or corrupt"
    if need > size:
        return f"it is {size:,} bytes but its tensors need {need:,} (truncated)"
    missing = [k.decode() for k in (b"general.architecture", b"tokenizer.ggml.tokens") if k not in keys]
    if missing or not n_tensors:
        return f"it has no {', '.join(missing) or 'tensors'} (not a language model's GGUF)"
    return None


# ---- model directories ------------------------------------------------------------------------


def _json(path: Path) -> tuple[object, str | None]:
    try:
        return json.loads(path.read_bytes()), None
    except (OSError, ValueError) as err:
        return None, f"{path.name} is not valid JSON ({err})"


_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def safetensors_problem(path: Path) -> str | None:
    """The header as the safetensors library reads it (its length, its JSON, each tensor's dtype,
    shape and offsets, the offsets tiling the data with no gap), and that the data fits the file:
    a header damaged in place, size unchanged, is found here rather than as a SafetensorError."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if 8 + n > size:
            return f"{path.name} is cut short ({size:,} bytes, less than its own header)"
        try:
            header = json.loads(f.read(n))
            spans = [(name, *_span(tensor)) for name, tensor in header.items() if name != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return f"{path.name} has a corrupt header (damaged, or not a safetensors file)"
    data = size - 8 - n
    end = max((stop for _, _, stop, _ in spans), default=0)
    if end > data:
        return f"{path.name} is truncated ({size:,} bytes, its tensors need {8 + n + end:,})"
    for name, begin, stop, need in spans:
        if need is not None and stop - begin != need:
            return (f"{path.name}'s tensor {name!r} needs {need:,} bytes at [{begin:,}, {stop:,}) of {data:,} bytes "
                    "of data (corrupt header)")
    at = 0
    for name, begin, stop, _ in sorted(spans, key=lambda span: span[1:3]):
        if begin != at:
            return f"{path.name}'s tensor {name!r} starts at byte {begin:,} of its data, not {at:,} (corrupt header)"
        at = stop
    return None


def _span(tensor: dict) -> tuple[int, int, int | None]:
    """(begin, end, the bytes its dtype and shape need: None for a dtype newer than this table)."""
    begin, end = tensor["data_offsets"]
    shape = tensor["shape"]
    if not all(type(v) is int and v >= 0 for v in (begin, end, *shape)) or end < begin:
        raise ValueError("offsets and shape must be non-negative integers")
    width = _DTYPE_BYTES.get(tensor["dtype"])
    return begin, end, None if width is None else math.prod(shape) * width


def torch_bin_problem(path: Path) -> str | None:
    """A torch.save archive is a zip whose index sits at the end: a cut one has lost it."""
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"PK":
        return None if zipfile.is_zipfile(path) else f"{path.name} is truncated (its zip index is missing)"
    # not a zip: only torch's pre-1.6 format (a pickle, protocol 2) is still a checkpoint
    return None if head == b"\x80\x02" else f"{path.name} is not a torch checkpoint"


def _weights_problem(folder: Path) -> str | None:
    for index in folder.glob("*.index.json"):  # sharded weights: every shard must be there
        data, _ = _json(index)
        shards = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(shards, dict):
            return f"{index.name} has no weight_map"
        missing = sorted({str(s) for s in shards.values() if not (folder / str(s)).is_file()})
        if missing:
            return f"the shards {', '.join(missing)} named in {index.name} are missing"
    checks = [(safetensors_problem, p) for p in sorted(folder.glob("*.safetensors"))]
    checks += [(torch_bin_problem, p) for p in sorted(folder.glob("pytorch_model*.bin"))]
    if not checks:
        return "it has no weights (no *.safetensors or pytorch_model*.bin)"
    return next(filter(None, (check(path) for check, path in checks)), None)


def model_dir_problem(folder: Path) -> str | None:
    """What a directory lacks to be a transformers model: config with model_type, weights, tokenizer."""
    if not (folder / "config.json").is_file():
        names = sorted(p.name for p in folder.iterdir())
        held = f"it holds {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}" if names else "it is empty"
        return f"it has no config.json ({held})"
    for path in sorted(folder.glob("*.json")):  # a truncated config or tokenizer.json
        config, problem = _json(path)
        if problem:
            return problem
    config, _ = _json(folder / "config.json")
    if not isinstance(config, dict) or not config.get("model_type"):
        return "its config.json has no model_type (not a transformers model config)"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"it has no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
    return _weights_problem(folder)


# ---- folders specpipe wrote (the dense cache) --------------------------------------------------


def write_manifest(folder: Path) -> None:
    """The last write into a finished folder: every file's size, for `folder_problem`."""
    sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != MANIFEST}
    _write_atomically(folder / MANIFEST, json.dumps(sizes, sort_keys=True))


def folder_problem(folder: Path) -> str | None:
    """A folder specpipe wrote against its manifest (a few stat calls). One written before
    manifests existed is checked by structure once and, if intact, given one."""
    if not folder.is_dir():
        return "it is not a folder"
    sizes, problem = _json(folder / MANIFEST)
    if problem and not (folder / MANIFEST).exists():
        if problem := model_dir_problem(folder):
            return problem
        with contextlib.suppress(OSError):
            write_manifest(folder)
        return None
    if problem or not isinstance(sizes, dict):
        return f"its manifest {MANIFEST} is corrupt"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size:,} bytes, expected {size:,} (truncated or replaced)"
    # damage inside a file's size: the weights' headers (a few kB each) and the JSON files are read
    for name in sorted(sizes):
        path = folder / name
        problem = (safetensors_problem(path) if name.endswith(".safetensors") else
                   _json(path)[1] if name.endswith(".json") else None)
        if problem:
            return problem
    return None


# ---- replacing cache entries -------------------------------------------------------------------


@contextlib.contextmanager
def cache_lock(target: Path, root: Path):
    """Hold an exclusive lock on building `target` (under cache `root`): a second process building
    the same entry waits here, then finds it built. The lock belongs to the open file, so a
    crashed holder leaves none behind; lock files are never deleted (deleting them would race)."""
    locks = root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{target.parent.name}-{target.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def discard(path: Path) -> None:
    """Remove a damaged cache entry, file or folder, and its record."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    marker(path).unlink(missing_ok=True)
