"""Save and load heads in the layouts vLLM reads, atomically.

Medusa (vLLM `model_type: medusa`): config.json with `num_heads`, `num_hidden_layers`,
`hidden_size`, `vocab_size`, `medusa_fc_bias: true`, and `original_lm_head: true` when the
target's LM head is shared (specpipe then stores no LM head: it uses the target's; an export
for vLLM adds a copy, since vLLM loads that one head from the checkpoint). Weights in
model.safetensors: `blocks.{h}.layers.{l}.weight|bias`, `lm_heads.{h}.weight` when not shared.
EAGLE (vLLM `method: eagle`, `EagleLlamaForCausalLM`): config.json of a one-layer Llama, weights
`fc.weight` [H, 2H] and `layers.0.*` (specpipe/heads/eagle.py); the target's token embeddings and
LM head are shared, so neither is stored. `draft_vocab.json` (specpipe's, which engines ignore)
lists the token ids the head was trained to guess: drafting scores only those rows of the LM
head, a fraction of its cost (SmolLM2's full LM head is a fifth of the model's weights).
A `specpipe` entry in config.json names the target the heads were trained on, so a mismatch
is refused before anything loads (`read_config`, used by the checks).
Weights over 40 MB are written as transformers' shards and index (`write_weights`): heads ship in
git beside their recipes, and no file there passes 50 MB.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import EagleHead, EagleShape
from specpipe.heads.integrity import INDEX, WEIGHTS, heads_problem, weight_files
from specpipe.heads.medusa import MedusaHeads

CONFIG, DRAFT_VOCAB = "config.json", "draft_vocab.json"
SHARD_BYTES = 40_000_000  # heads are shipped in git beside recipes: no file over 50 MB


def save_medusa(heads: MedusaHeads, folder: Path, *, target: str, extra: dict | None = None) -> Path:
    config = {
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size, "num_heads": heads.num_heads, "num_hidden_layers": heads.num_layers,
        "truncated_vocab_size": None, "original_lm_head": heads.shared_lm_head, "medusa_fc_bias": True,
        "specpipe": {"kind": "medusa", "target": target, **(extra or {})},
    }
    tensors = {name: t.detach().contiguous() for name, t in heads.state_dict().items()}
    return write_folder(folder, config, tensors)


def load_medusa(folder: Path) -> MedusaHeads:
    config = read_config(folder, "medusa")
    heads = MedusaHeads(config["hidden_size"], config["vocab_size"], config["num_heads"],
                        config["num_hidden_layers"], shared_lm_head=bool(config.get("original_lm_head", True)))
    _load_into(heads, folder, "Medusa heads")
    return heads.eval()


def read_weights(folder: Path | str) -> dict[str, torch.Tensor]:
    """A folder's tensors: `model.safetensors`, or the shards its `model.safetensors.index.json`
    maps them to (transformers' layout, which vLLM and speculators load too)."""
    folder = Path(folder)
    if problem := heads_problem(folder):  # checked like a model's files: never a raw safetensors error
        raise SpecpipeError(damaged_heads(folder, problem))
    files, _ = weight_files(folder)
    try:
        return {name: t for file in files for name, t in load_file(str(folder / file)).items()}
    except Exception as err:  # what the structure check cannot see (bytes of an unknown dtype, ...)
        raise SpecpipeError(damaged_heads(folder, f"safetensors cannot read it ({err})")) from None


def damaged_heads(folder: Path | str, problem: str) -> str:
    """The message for a heads folder whose weights are damaged (the checks give the same)."""
    return (f"The heads in {folder} are damaged: {problem}. Copy the whole heads folder again (or restore it "
            "from the recipe's repository), or train them again: specpipe train.")


def write_weights(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """`model.safetensors`, or past `SHARD_BYTES`, files `model-0000i-of-0000n.safetensors` of at
    most that much each (a larger tensor alone in its own) and their index."""
    shards, room = [], 0  # [{name: tensor}], bytes left in the last shard
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        if not shards or size > room:
            shards.append({})
            room = SHARD_BYTES
        shards[-1][name], room = t, room - size
    if len(shards) <= 1:
        save_file(tensors, str(folder / WEIGHTS))
        return
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file(shard, str(folder / name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: n for n, s in zip(names, shards) for k in s}}
    (folder / INDEX).write_text(json.dumps(index, indent=1) + "\n")


def _load_into(module, folder: Path, what: str) -> None:
    state = read_weights(folder)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecpipeError(f"The {what} in {folder} do not match their config.json (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}). Re-train or re-export them.")
    module.to(next(iter(state.values())).dtype)


def save_eagle(head: EagleHead, folder: Path, *, target: str, extra: dict | None = None) -> Path:
    shape = head.shape
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "bias": False,
        **{k: v for k, v in shape.as_dict().items() if k != "rope_theta"},
        "rope_theta": shape.rope_theta, "rope_scaling": None, "max_position_embeddings": 32768,
        "specpipe": {"kind": "eagle", "target": target, **(extra or {})},
    }
    tensors = {name: t.detach().contiguous() for name, t in head.state_dict().items()}
    vocab = head.draft_vocab
    files = {} if vocab is None else {DRAFT_VOCAB: json.dumps([int(i) for i in vocab])}
    return write_folder(folder, config, tensors, files)


def load_draft_vocab(folder: Path) -> torch.Tensor | None:
    """The token ids an EAGLE head drafts from, or None (the whole vocabulary)."""
    path = Path(folder) / DRAFT_VOCAB
    return torch.tensor(json.loads(path.read_text()), dtype=torch.long) if path.exists() else None


def load_eagle(folder: Path) -> EagleHead:
    config = read_config(folder, "eagle")
    head = EagleHead(EagleShape(**{k: config[k] for k in EagleShape.__dataclass_fields__}))
    _load_into(head, folder, "EAGLE head")
    head.draft_vocab = load_draft_vocab(folder)
    return head.eval()


def read_config(folder: Path | str, kind: str) -> dict:
    path = Path(folder) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecpipeError(f"proposer.heads={folder}: no readable {CONFIG} there ({err}). Point it at a folder "
                            f"written by `specpipe train proposer={kind}`.") from None
    found = config.get("specpipe", {}).get("kind", config.get("model_type"))
    if found != kind:
        other = f"use proposer={found}, or " if found in ("medusa", "eagle") else ""
        raise SpecpipeError(f"proposer.heads={folder} holds {found!r} heads, not {kind} heads: {other}point "
                            f"proposer.heads at {kind} heads written by `specpipe train proposer={kind}`.")
    return config


def write_folder(folder: Path, config: dict, tensors: dict, files: dict[str, str] | None = None) -> Path:
    """Write into a temporary sibling folder, then swap it in: never a half-written checkpoint."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; heads are shipped and shared
        write_weights(tensors, tmp)
        (tmp / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        for name, text in (files or {}).items():
            (tmp / name).write_text(text + "\n")
        if folder.exists():
            old = folder.with_name(f".{folder.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    finally:  # a failed or interrupted write leaves no temporary folder behind
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
