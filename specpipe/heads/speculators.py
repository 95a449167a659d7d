"""EAGLE-3 heads as `speculators` checkpoints (the format vLLM loads EAGLE-3 heads in).

A folder holds `config.json` and `model.safetensors` (past 40 MB, its shards and their index), as
speculators 0.9.0's `save_pretrained` writes them: `speculators_model_type: eagle3`;
`speculators_config` with the algorithm, one greedy proposal method (its `speculative_tokens`:
the steps the head was trained to draft, `specpipe train`'s `ttt`) and the verifier (the
target's hub id and architectures: `vllm serve <folder>` serves that target with this head);
`transformer_layer_config` (the decoder layer, a Llama config); `draft_vocab_size`,
`norm_before_residual`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` (the target
layers whose input is fused); weights as specpipe/heads/eagle3.py lists them, `d2t` and `t2d`
included. specpipe leaves out `embed_tokens` (the target's; speculators and vLLM both take the target's when it is
missing, and SmolLM2's would take 56 MB) and writes what it knows of the training beside it, in
`specpipe.json` (speculators' config classes validate config.json's keys).

Third-party heads load too: speculators checkpoints, and the EAGLE-3 layout of the paper's
authors and SpecForge (`LlamaForCausalLMEagle3`, a Llama config at the top, layer weights
under `midlayer.`). Options specpipe does not implement (several draft layers, a Qwen3 layer,
`norm_before_fc`, `fc_norm`, `norm_output`) are refused by name, never ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specpipe.errors import SpecpipeError
from specpipe.heads.eagle import EagleShape
from specpipe.heads.eagle3 import Eagle3Head, Eagle3Shape
from specpipe.heads.io import CONFIG, read_weights, write_folder

SPECPIPE = "specpipe.json"  # what specpipe knows of a head it trained: its target, its figures
VERSION = "0.9.0"  # the speculators release whose format this is
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # speculators options this head lacks


def save_eagle3(head: Eagle3Head, folder: Path, *, target: str, extra: dict | None = None, gamma: int = 3) -> Path:
    """The head as a speculators checkpoint; `target`: the name it was trained on (zoo name,
    hub id or path; the verifier entry holds its hub id)."""
    from specpipe.declaration import engine_model

    shape = head.shape
    config = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": VERSION,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": gamma, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": engine_model(target), "architectures": _architecture(target)}},
        "transformer_layer_config": _layer_config(shape.layer),
        "draft_vocab_size": shape.draft_vocab_size, "norm_before_residual": shape.norm_before_residual,
        "target_hidden_size": shape.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(shape.target_layers),
        **{key: False for key in UNSUPPORTED}, "embed_requires_grad": False,
        "tie_word_embeddings": False, "dtype": str(head.norm.weight.dtype).removeprefix("torch."),
    }
    tensors = {name: t.detach().contiguous() for name, t in head.state_dict().items()}
    info = {"kind": "eagle3", "target": target, **(extra or {})}
    return write_folder(folder, config, tensors, {SPECPIPE: json.dumps(info, indent=1)})


def load_eagle3(folder: Path | str, target_layers: int | None = None) -> Eagle3Head:
    """A head from a speculators (or SpecForge-layout) EAGLE-3 checkpoint; target_layers: the
    target's layer count, for a checkpoint that names no aux layers (vLLM's default then)."""
    shape = _shape(folder, _config(folder), target_layers)
    head = Eagle3Head(shape)
    state = {_rename(k): v for k, v in read_weights(folder).items()}
    if "d2t" not in state and shape.draft_vocab_size == shape.layer.vocab_size:  # no draft vocabulary: the target's
        state["d2t"] = head.d2t
    if "t2d" not in state and "d2t" in state:  # vLLM reads d2t alone; t2d follows from it
        state["t2d"] = torch.zeros_like(head.t2d).index_fill_(0, torch.arange(len(state["d2t"])) + state["d2t"], True)
    own_embeddings = state.pop("embed_tokens.weight", None)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecpipeError(f"The EAGLE-3 head in {folder} does not match its config.json (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}). Re-train it with specpipe train proposer=eagle3, or "
                            "re-save it with speculators.")
    if own_embeddings is not None:
        head.embed_tokens = torch.nn.Embedding.from_pretrained(own_embeddings.float(), freeze=True)
    return head.to(next(v.dtype for v in state.values() if v.is_floating_point())).eval()


def fit_summary(folder: Path | str) -> dict:
    """What the checks compare with the target before anything loads (see Declaration.read_heads)."""
    config = _config(folder)
    layer = _layer_dict(config)
    info_path = Path(folder) / SPECPIPE
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    _shape(folder, config, None, check_only=True)
    return {"hidden_size": config.get("target_hidden_size") or layer.get("hidden_size"),
            "vocab_size": layer.get("vocab_size"), "specpipe": info,
            "reads_layers": list(_aux_ids(config) or [])}


def _config(folder: Path | str) -> dict:
    path = Path(folder) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecpipeError(f"proposer.heads={folder}: no readable {CONFIG} there ({err}). Point it at an EAGLE-3 "
                            "head: a speculators checkpoint, or one written by `specpipe train proposer=eagle3`.") from None
    found = config.get("speculators_model_type") or ("eagle3" if _specforge(config) else None)
    if found != "eagle3":
        what = found or config.get("specpipe", {}).get("kind") or config.get("model_type")
        raise SpecpipeError(f"proposer.heads={folder} holds {what!r}, not an EAGLE-3 head (config.json has no "
                            "speculators_model_type: eagle3): point proposer.heads at a speculators EAGLE-3 "
                            "checkpoint, or use the proposer its heads were trained for (e.g. proposer=eagle).")
    return config


def _specforge(config: dict) -> bool:
    return any("Eagle3" in a for a in config.get("architectures", ())) and "hidden_size" in config


def _layer_dict(config: dict) -> dict:
    return config.get("transformer_layer_config") or (config if _specforge(config) else {})


def _aux_ids(config: dict) -> list[int] | None:
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if ids else None


def _shape(folder, config: dict, target_layers: int | None, check_only: bool = False) -> Eagle3Shape | None:
    layer = _layer_dict(config)
    refused = [f"{key}: true" for key in UNSUPPORTED if config.get(key)]
    if layer.get("num_hidden_layers", 1) != 1:
        refused.append(f"{layer['num_hidden_layers']} draft decoder layers (specpipe runs one)")
    if layer.get("model_type", "llama") not in ("llama",):
        refused.append(f"a {layer['model_type']} draft layer (specpipe's is a Llama layer)")
    if refused:
        raise SpecpipeError(f"The EAGLE-3 head in {folder} uses {', '.join(refused)}: specpipe's EAGLE-3 head does "
                            "not implement that, and guessing would draft nonsense. Use a head with one Llama "
                            "layer and those options off (what specpipe train proposer=eagle3 writes).")
    if check_only:
        return None
    ids = _aux_ids(config)
    if ids is None:
        if target_layers is None:
            raise SpecpipeError(f"The EAGLE-3 head in {folder} names no eagle_aux_hidden_state_layer_ids and the "
                                "target's layer count is unknown: add the ids to its config.json.")
        from specpipe.heads.eagle3 import default_layers

        ids = list(default_layers(target_layers))
    heads = layer["num_attention_heads"]
    rope = (layer.get("rope_parameters") or {}).get("rope_theta") or layer.get("rope_theta") or 10000.0
    shape = EagleShape(layer["hidden_size"], layer["vocab_size"], heads, layer.get("num_key_value_heads") or heads,
                       layer.get("head_dim") or layer["hidden_size"] // heads, layer["intermediate_size"],
                       float(rope), float(layer.get("rms_norm_eps", 1e-6)))
    # vLLM's rule: norm_before_residual is True where the key is absent (speculators always writes it)
    return Eagle3Shape(shape, config.get("target_hidden_size") or shape.hidden_size,
                       config.get("draft_vocab_size") or shape.vocab_size, tuple(ids),
                       bool(config.get("norm_before_residual", True)))


def _rename(key: str) -> str:
    """SpecForge's and the EAGLE authors' `midlayer.` is speculators' `layers.0.`."""
    return "layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key


def _layer_config(shape: EagleShape) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size, "num_attention_heads": shape.num_attention_heads,
            "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
            "num_hidden_layers": 1, "vocab_size": shape.vocab_size, "rms_norm_eps": shape.rms_norm_eps,
            "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 32768,
            "tie_word_embeddings": False}


def _architecture(target: str) -> list[str]:
    """The target's transformers class, from its config.json (a zoo model's cached copy, or a
    local folder's); none when it cannot be read (a hub id: specpipe downloads nothing here)."""
    from specpipe.models.zoo import ZOO, dense_dir

    path = (dense_dir(target) if target in ZOO else Path(target).expanduser()) / CONFIG
    try:
        return list(json.loads(path.read_text())["architectures"][:1])
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return []
