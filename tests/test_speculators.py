"""specpipe's EAGLE-3 checkpoints against the real `speculators` package, both directions.

speculators 0.9.0 pins transformers <= 5.19 and pulls torchvision and torchaudio, so it is not
one of the project's test dependencies. This test runs its half (tests/speculators_side.py)
under an interpreter that has it: this one if it imports `speculators`, else
`$SPECPIPE_SPECULATORS_PYTHON` (a side environment: `python -m venv /tmp/specenv &&
/tmp/specenv/bin/pip install torch==2.13.0 transformers safetensors openai datasets
hs_connectors loguru && /tmp/specenv/bin/pip install --no-deps speculators==0.9.0`), and is
skipped when neither has it.

1. speculators' own config classes read what specpipe writes, its model class loads the
   weights (nothing unexpected; missing only the training-only teachers and the embeddings
   specpipe shares with the target), and its forward drafts the same tokens as specpipe's head
   over two training-time-test steps.
2. A checkpoint speculators' `save_pretrained` writes is what specpipe loads, and drafts the same.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpipe.heads.eagle import HeadCache
from specpipe.heads.speculators import load_eagle3, save_eagle3
from specpipe.train.eagle3 import shifted, ttt_mask
from test_eagle3 import LAYERS, VOCAB, random_head, target4, target4_dir  # noqa: F401 (target4_dir: a fixture)


def _python() -> str | None:
    if importlib.util.find_spec("speculators") is not None:
        return sys.executable
    side = os.environ.get("SPECPIPE_SPECULATORS_PYTHON")
    if side and Path(side).exists():
        probe = subprocess.run([side, "-c", "import speculators"], capture_output=True)
        return side if probe.returncode == 0 else None
    return None


PYTHON = _python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="the speculators package is not installed here (nor in "
                                "$SPECPIPE_SPECULATORS_PYTHON)")
SIDE = Path(__file__).with_name("speculators_side.py")


def inputs(tmp_path: Path, embed: torch.Tensor) -> Path:
    torch.manual_seed(1)
    path = tmp_path / "inputs.safetensors"
    save_file({"embed": embed.float().contiguous(), "hidden": torch.randn(1, 9, 3 * embed.shape[1]),
               "ids": torch.randint(0, VOCAB, (1, 9))}, str(path))
    return path


def side(mode: str, head: Path, given: Path, tmp_path: Path) -> tuple[dict, dict]:
    out = tmp_path / f"{mode}.safetensors"
    run = subprocess.run([PYTHON, str(SIDE), mode, str(head), str(given), str(out)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    return load_file(str(out)), json.loads(Path(f"{out}.json").read_text())


def specpipe_steps(head, given: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft ids of two training-time-test steps, as specpipe's trainer unrolls the head."""
    embed = given["embed"]
    t = given["ids"].shape[1]
    cache, out = HeadCache(), head.fuse(given["hidden"])
    ids = []
    with torch.no_grad():
        for step in range(2):
            tokens = shifted(given["ids"], step, 0)
            out = head(embed[tokens], out, torch.arange(t)[None] + step, ttt_mask(t, step), cache)
            ids.append(head.logits(out).argmax(-1))
    return ids[0], ids[1]


def test_speculators_reads_what_specpipe_writes(tmp_path):
    head = random_head(11, torch.arange(0, VOCAB, 3)).float()
    save_eagle3(head, tmp_path / "e3", target="tiny", gamma=4)
    embed = target4(torch.float32).model.get_input_embeddings().weight.detach()
    given = inputs(tmp_path, embed)
    steps, report = side("read", tmp_path / "e3", given, tmp_path)
    assert report["config_class"] == "Eagle3SpeculatorConfig" and report["draft_vocab_size"] == len(range(0, VOCAB, 3))
    assert report["aux_ids"] == list(LAYERS) and report["speculative_tokens"] == 4
    assert report["norm_before_residual"] is False and report["unexpected"] == []
    assert set(report["missing"]) <= {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    mine = specpipe_steps(head, load_file(str(given)))
    assert torch.equal(steps["step0"], mine[0]) and torch.equal(steps["step1"], mine[1])


def test_specpipe_loads_what_speculators_writes(tmp_path):
    embed = target4(torch.float32).model.get_input_embeddings().weight.detach()
    given = inputs(tmp_path, embed)
    steps, report = side("write", tmp_path / "e3", given, tmp_path)
    assert {"config.json", "model.safetensors"} <= set(report["files"])
    head = load_eagle3(tmp_path / "e3").float()
    assert head.target_layers == (1, 2, 3) and head.draft_ids.tolist() == list(range(0, VOCAB, 2))
    assert head.embed_tokens is not None  # speculators stores the embeddings it was given
    mine = specpipe_steps(head, load_file(str(given)))
    assert torch.equal(steps["step0"], mine[0]) and torch.equal(steps["step1"], mine[1])


def test_speculators_loads_a_sharded_head(tmp_path, monkeypatch, target4_dir):
    """Past SHARD_BYTES a head is saved as transformers' shards and index: specpipe reads it back
    bit-exact, and speculators' own from_pretrained loads the same tensors and drafts the same ids."""
    import specpipe.heads.io as io

    monkeypatch.setattr(io, "SHARD_BYTES", 4000)
    head = random_head(11, torch.arange(0, VOCAB, 3)).float()
    save_eagle3(head, tmp_path / "e3", target=str(target4_dir), gamma=4)  # the verifier: a local folder
    files = sorted(p.name for p in (tmp_path / "e3").iterdir())
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    shards = [load_file(str(tmp_path / "e3" / f)) for f in files if f.startswith("model-")]
    assert len(shards) > 1 and all(len(s) == 1 or sum(t.numel() * t.element_size() for t in s.values()) <= 4000
                                   for s in shards)  # a tensor over the bound sits alone
    loaded = load_eagle3(tmp_path / "e3")
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in head.state_dict().items())
    embed = target4(torch.float32).model.get_input_embeddings().weight.detach()
    given = inputs(tmp_path, embed)
    steps, report = side("load", tmp_path / "e3", given, tmp_path)
    assert report["config_class"] == "Eagle3SpeculatorConfig" and report["draft_vocab_size"] == len(head.d2t)
    theirs = load_file(str(tmp_path / "loaded.safetensors"))
    assert set(theirs) == set(head.state_dict()) and all(torch.equal(theirs[k], t) for k, t in head.state_dict().items())
    mine = specpipe_steps(head, load_file(str(given)))
    assert torch.equal(steps["step0"], mine[0]) and torch.equal(steps["step1"], mine[1])
