"""Load a causal LM and its tokenizer from a zoo name, a GGUF file, a local directory or a hub id.

All four go through the same two functions, `load_tokenizer` and `load_model`, so the checks
that compare tokenizers run before any weights load. A GGUF file is dequantized by
transformers on its first load (tens of seconds) and saved as safetensors in the specpipe cache;
later loads read that dense copy. Every file is checked before transformers reads it
(`integrity`): a damaged or foreign file given by the user is refused with what is wrong; a
damaged cache entry is rebuilt from its source. This module does not quantize (see `quantize.py`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specpipe.errors import SpecpipeError
from specpipe.models import integrity, zoo


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are. `gguf` is set for GGUF sources, `dense` is their safetensors copy."""

    name: str
    path: str  # a directory, or a hub id
    gguf: str | None = None
    dense: Path | None = None
    tokenizer_family: str | None = None  # known without loading for zoo models

    @property
    def is_dense_cached(self) -> bool:
        """An intact dense copy exists (checked on every call: a few stat calls)."""
        return self.dense is not None and integrity.folder_problem(self.dense) is None


def resolve(name: str, *, fetch: bool = True) -> ModelSource:
    """Zoo name, `.gguf` file, directory or hub id -> ModelSource (fetching zoo models)."""
    if name in zoo.ZOO:
        entry = zoo.ZOO[name]
        gguf = zoo.fetch(name) if fetch else zoo.model_dir(name) / entry.filename
        return ModelSource(name, str(gguf.parent), gguf.name, zoo.dense_dir(name), entry.tokenizer_family)
    path = Path(name).expanduser()
    if path.is_file():  # whatever its suffix: a file can only be a GGUF
        source = ModelSource(name, str(path.parent), path.name, _dense_dir_for(path))
        if not source.is_dense_cached:  # else it was intact when cached (the key is size + mtime)
            _refuse(name, "GGUF file", integrity.gguf_problem, path)
        return source
    if path.is_dir():
        _refuse(name, "model directory", integrity.model_dir_problem, path)
        return ModelSource(name, str(path))
    if path.suffix == ".gguf" or name.startswith((".", "/", "~")):
        raise SpecpipeError(
            f"Model '{name}' was not found: no such file or directory. Pass a zoo name "
            f"({', '.join(zoo.ZOO)}), an existing .gguf file, a model directory, or a hub id."
        )
    return ModelSource(name, name)  # a hub id: transformers resolves it (or fails, see below)


FOUR_BIT_TYPES = {2, 3, 14, 15}  # GGUF general.file_type: Q4_0, Q4_1, Q4_K_S, Q4_K_M


def four_bit_source(name: str) -> bool:
    """Whether `name` (a zoo name or a .gguf file) holds 4-bit weights, from the zoo's table or
    the file's header alone (no weights read): what `model.quantize=auto` keeps on the CPU."""
    if name in zoo.ZOO:
        return "Q4" in zoo.ZOO[name].filename.upper()
    path = Path(name).expanduser()
    if not path.is_file():
        return False
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields.get("general.file_type")
        return field is not None and int(field.parts[field.data[0]][0]) in FOUR_BIT_TYPES
    except Exception:  # not a readable GGUF: the loader names the problem
        return False


_ADVICE = {
    "GGUF file": "Download or convert it again, or pass a model directory or a zoo name",
    "model directory": "A model directory holds what save_pretrained writes (config.json with a "
                       "model_type, *.safetensors weights, tokenizer files); pass one, a .gguf file, or a zoo name",
}


def _refuse(name: str, kind: str, check, path: Path) -> None:
    """A SpecpipeError saying what is wrong with the user's file, if `check` finds anything."""
    try:
        problem = check(path)
    except OSError as err:  # unreadable (permissions, a dangling link inside a folder, ...)
        problem = f"it cannot be read ({err})"
    if problem:
        raise SpecpipeError(
            f"Model '{name}' is not a usable {kind}: {problem}. {_ADVICE[kind]} ({', '.join(zoo.ZOO)})."
        )


def _dense_dir_for(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return zoo.cache_root() / "dense" / f"{gguf.stem}-{key}"


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    if source.is_dense_cached:
        return AutoTokenizer.from_pretrained(source.dense)
    return _from_pretrained(AutoTokenizer, source)


def load_config(source: ModelSource):
    """The model's config (hidden size, vocabulary) without its weights."""
    from transformers import AutoConfig

    if source.is_dense_cached:
        return AutoConfig.from_pretrained(source.dense)
    return _from_pretrained(AutoConfig, source)


def zoo_config(name: str):
    """A zoo model's config from its zoo entry, without fetching it: what `specpipe check` and
    `export` judge a model by before its first download (architecture, sizes, vocabulary)."""
    from transformers import AutoConfig

    entry = zoo.ZOO[name]
    fields = {key: value for key, value in entry.config.items() if key != "model_type"}
    return AutoConfig.for_model(entry.config["model_type"], vocab_size=entry.vocab_size, **fields)


def load_model(source: ModelSource, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Weights as a dense HF model in eval mode (GGUF: dequantized once, then cached)."""
    from transformers import AutoModelForCausalLM

    if source.gguf and not source.is_dense_cached:
        _write_dense_cache(source)
    where = source.dense if source.is_dense_cached else None
    if where is not None:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    else:
        model = _from_pretrained(AutoModelForCausalLM, source, dtype=dtype)
    return model.eval()


def _from_pretrained(cls, source: ModelSource, **kwargs):
    extra = {"gguf_file": source.gguf} if source.gguf else {}
    try:
        return cls.from_pretrained(source.path, **extra, **kwargs)
    except (OSError, ValueError, RuntimeError) as err:  # a file it cannot read or that does not fit
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise SpecpipeError(
            f"Could not load model '{source.name}': {first_line} Pass a zoo name "
            f"({', '.join(zoo.ZOO)}), a local .gguf file or model directory, or a hub id on a "
            "machine that can reach the hub (see `specpipe models`)."
        ) from None


def _write_dense_cache(source: ModelSource) -> None:
    """Dequantize the GGUF once and save it (model + tokenizer) as safetensors, atomically.

    Under the cache lock, so a second process loading the same model waits, then reads ours.
    """
    try:
        with integrity.cache_lock(source.dense, zoo.cache_root()):
            if source.is_dense_cached:  # another process built it while we waited
                return
            if os.path.lexists(source.dense):
                zoo.warn(f"The cached dense copy of {source.name} ({source.dense}) is damaged: "
                         f"{integrity.folder_problem(source.dense)}. Rebuilding it from the GGUF.")
                integrity.discard(source.dense)
            _dequantize_into(source)
    except OSError as err:  # the cache is not writable, or the disk is full
        raise SpecpipeError(
            f"Could not cache the dense copy of model '{source.name}' in {source.dense}: {err}. Set "
            "SPECPIPE_CACHE to a writable directory with enough free space."
        ) from err


def _dequantize_into(source: ModelSource) -> None:
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specpipe.markup import esc

    Console(stderr=True).print(
        f"[dim]First load of {esc(source.name)}: dequantizing the GGUF and caching it as safetensors "
        f"in {esc(source.dense)} (once).[/dim]"
    )
    model = _from_pretrained(AutoModelForCausalLM, source, dtype=torch.float32)
    tokenizer = _from_pretrained(AutoTokenizer, source)
    source.dense.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dense-", dir=source.dense.parent))
    try:
        # the weights are dense floats now; drop the GGUF marker that makes HF refuse to save
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        integrity.write_manifest(tmp)  # last: what an intact copy holds, for later loads
        os.replace(tmp, source.dense)  # a half-written copy never becomes the cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class LoadedModel:
    """A model ready to decode: weights, tokenizer, and the name it was asked for. Built with
    model=None and a source, the dense weights load on first use (engine=llamacpp runs the GGUF
    itself and needs them only for what reads torch weights, e.g. transformers' peers)."""

    def __init__(self, name: str, model: torch.nn.Module | None, tokenizer, source: ModelSource | None = None):
        self.name, self.tokenizer, self.source = name, tokenizer, source
        self._model = model

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            if self.source is None:
                raise SpecpipeError(f"Model '{self.name}' has no weights loaded and no source to load them from.")
            self._model = load_model(self.source)
        return self._model


def load(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    source = resolve(name)
    return LoadedModel(name, load_model(source, dtype), load_tokenizer(source), source)
