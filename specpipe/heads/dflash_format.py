"""DFlash drafters as published: z-lab's checkpoints and speculators' `dflash` format.

z-lab (`DFlashDraftModel`, the `dflash` package and the hub's `*-DFlash*` folders): config.json
is a Qwen3 config (`architectures: [DFlashDraftModel]`, `num_hidden_layers`: the draft layers,
`num_target_layers`) plus `block_size`, `target_layer_ids` and `mask_token_id`, each read from
`dflash_config` first, then the top level, as the package reads them; `target_layer_ids` count
from 0, id k the output of target layer k (the runner's key k); without them, z-lab's spread.
speculators (`speculators_model_type: dflash`): `transformer_layer_config` (the Qwen3 layer),
`draft_vocab_size`, `block_size`, `mask_token_id`, `target_hidden_size` and
`aux_hidden_state_layer_ids` in vLLM's convention (id k: the input of target layer k, so the
runner's key k - 1); a drafter with a draft vocabulary stores its `lm_head` and `d2t`.
Weights: model.safetensors (or shards), names as specpipe/heads/dflash.py lists them; the
target's embeddings and LM head are never stored (speculators' `embed_tokens`, `verifier_*`
copies are dropped).

What specpipe's drafter does not compute is refused by name, never ignored: DFlash2's
convolutions and candidate selector, Domino's correction head, sliding-window or causal draft
layers, attention biases, RoPE scaling, an activation other than SiLU, drafts from the anchor.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.heads.dflash import DFlashDrafter, DFlashShape, build_target_layer_ids
from specpipe.heads.eagle import EagleShape
from specpipe.heads.io import CONFIG, read_weights, write_folder

QWEN3_ROPE_THETA = 1_000_000.0  # Qwen3Config's default, for a config that names none
DROPPED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight", "t2d")  # the target's own


def read_shape(folder: Path | str) -> DFlashShape:
    """The drafter's shape from its config.json, refusing what specpipe does not compute."""
    config = _config(folder)
    if config.get("speculators_model_type") == "dflash":
        return _speculators_shape(folder, config)
    return _zlab_shape(folder, config)


def load_dflash(folder: Path | str) -> DFlashDrafter:
    shape = read_shape(folder)
    drafter = DFlashDrafter(shape)
    state = {k: v for k, v in read_weights(folder).items() if k not in DROPPED}
    if shape.draft_vocab_size is not None and "d2t" not in state:  # a full-vocabulary head of its own
        state["d2t"] = drafter.d2t
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecpipeError(f"The DFlash drafter in {folder} does not match its config.json (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}): point proposer.heads at a DFlash checkpoint (z-lab's "
                            "or speculators').")
    return drafter.to(next(v.dtype for v in state.values() if v.is_floating_point())).eval()


def fit_summary(folder: Path | str) -> dict:
    """What the checks compare with the target before anything loads (Declaration.read_heads):
    the hidden size, the vocabulary, and the layers read as the inputs of target layers k + 1."""
    shape = read_shape(folder)
    return {"hidden_size": shape.layer.hidden_size, "vocab_size": shape.layer.vocab_size, "specpipe": {},
            "reads_layers": [k + 1 for k in shape.target_layer_ids], "block_size": shape.block_size}


def save_dflash(drafter: DFlashDrafter, folder: Path | str, num_target_layers: int) -> Path:
    """The drafter in z-lab's format (what `DFlashDraftModel.from_pretrained` reads)."""
    shape, layer = drafter.shape, drafter.shape.layer
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": layer.hidden_size,
        "intermediate_size": layer.intermediate_size, "num_attention_heads": layer.num_attention_heads,
        "num_key_value_heads": layer.num_key_value_heads, "head_dim": layer.head_dim,
        "num_hidden_layers": shape.num_layers, "num_target_layers": num_target_layers,
        "vocab_size": layer.vocab_size, "rms_norm_eps": layer.rms_norm_eps, "hidden_act": "silu",
        "rope_theta": layer.rope_theta, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "block_size": shape.block_size,
        "dtype": str(drafter.norm.weight.dtype).removeprefix("torch."),
        "dflash_config": {"mask_token_id": shape.mask_token_id, "target_layer_ids": list(shape.target_layer_ids)},
    }
    tensors = {name: t.detach().contiguous() for name, t in drafter.state_dict().items()}
    return write_folder(Path(folder), config, tensors)


def _config(folder: Path | str) -> dict:
    try:
        return json.loads((Path(folder) / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecpipeError(f"proposer.heads={folder}: no readable {CONFIG} there ({err}). Point it at a DFlash "
                            "drafter: z-lab's checkpoint folder, or a speculators dflash one.") from None


def _zlab_shape(folder, config: dict) -> DFlashShape:
    architectures = config.get("architectures") or []
    if "DFlashDraftModel" not in architectures:
        what = config.get("speculators_model_type") or config.get("specpipe", {}).get("kind") or architectures
        raise SpecpipeError(f"proposer.heads={folder} holds {what!r}, not a DFlash drafter (config.json names no "
                            "DFlashDraftModel architecture and no speculators_model_type: dflash): point "
                            "proposer.heads at a DFlash checkpoint, or use the proposer it was made for (DFlash2 and "
                            "DSpark are other drafters).")
    own = config.get("dflash_config") or {}

    def value(name, default=None):
        return own.get(name, config.get(name, default))

    _refuse(folder, config, own)
    ids = value("target_layer_ids")
    if ids is None:
        if "num_target_layers" not in config:
            raise SpecpipeError(f"The DFlash drafter in {folder} names neither target_layer_ids nor num_target_layers: "
                                "add dflash_config.target_layer_ids to its config.json.")
        ids = build_target_layer_ids(int(config["num_target_layers"]), int(config["num_hidden_layers"]))
    return _shape(folder, config, ids, int(value("block_size", 16)), value("mask_token_id"),
                  embedding_scale=float(value("input_embedding_scale", 1.0)),
                  logit_scale=float(value("output_multiplier", 1.0)), logit_softcap=value("final_logit_softcapping"))


def _speculators_shape(folder, config: dict) -> DFlashShape:
    layer = config.get("transformer_layer_config") or {}
    refused = []
    if config.get("projector_type", "dflash") != "dflash":
        refused.append(f"projector_type: {config['projector_type']} (a correction head)")
    if config.get("sample_from_anchor"):
        refused.append("sample_from_anchor: true (it drafts the anchor's token too)")
    if (config.get("target_hidden_size") or layer.get("hidden_size")) != layer.get("hidden_size"):
        refused.append(f"target_hidden_size {config['target_hidden_size']} unlike its own {layer.get('hidden_size')} "
                       "(the target's embeddings feed it)")
    _refuse(folder, layer, {}, refused)
    ids = [int(k) - 1 for k in config.get("aux_hidden_state_layer_ids") or []]  # vLLM's input of k: output of k - 1
    if not ids:
        raise SpecpipeError(f"The DFlash drafter in {folder} names no aux_hidden_state_layer_ids: add them to its "
                            "config.json (the target layers it was trained on).")
    vocab = config.get("draft_vocab_size") or layer.get("vocab_size")
    has_head = vocab != layer.get("vocab_size") or "lm_head.weight" in read_weights(folder)
    return _shape(folder, layer, ids, int(config.get("block_size", 8)), config.get("mask_token_id"),
                  draft_vocab_size=int(vocab) if has_head else None)


def _refuse(folder, layer: dict, own: dict, refused: list[str] | None = None) -> None:
    refused = list(refused or [])
    if any(t != "full_attention" for t in layer.get("layer_types") or ()) or own.get("use_swa"):
        refused.append("sliding-window draft layers")
    if layer.get("is_causal") or own.get("causal"):
        refused.append("causal draft layers")
    if layer.get("attention_bias"):
        refused.append("attention biases")
    if layer.get("hidden_act", "silu") != "silu":
        refused.append(f"hidden_act {layer['hidden_act']}")
    rope = layer.get("rope_scaling") or layer.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        refused.append(f"RoPE scaling {rope.get('rope_type', rope.get('type'))}")
    if any("DFlash2" in a or "DSpark" in a for a in layer.get("architectures") or ()):
        refused.append(f"the {layer['architectures'][0]} architecture")
    if refused:
        raise SpecpipeError(f"The DFlash drafter in {folder} uses {', '.join(refused)}: specpipe's DFlash drafter does "
                            "not implement that, and guessing would draft nonsense. Use a plain DFlash checkpoint "
                            "(full attention, non-causal, Qwen3 layers).")


def _shape(folder, layer: dict, ids, block_size: int, mask_token_id, **extra) -> DFlashShape:
    vocab = int(layer["vocab_size"])
    if mask_token_id is None or not 0 <= int(mask_token_id) < vocab:
        raise SpecpipeError(f"The DFlash drafter in {folder} has mask_token_id {mask_token_id!r}, which is no row of a "
                            f"{vocab}-token vocabulary: set dflash_config.mask_token_id in its config.json.")
    if block_size < 2:
        raise SpecpipeError(f"The DFlash drafter in {folder} has block_size {block_size}: it drafts nothing below 2.")
    heads = int(layer["num_attention_heads"])
    rope = (layer.get("rope_parameters") or {}).get("rope_theta") or layer.get("rope_theta") or QWEN3_ROPE_THETA
    shape = EagleShape(int(layer["hidden_size"]), vocab, heads, int(layer.get("num_key_value_heads") or heads),
                       int(layer.get("head_dim") or layer["hidden_size"] // heads), int(layer["intermediate_size"]),
                       float(rope), float(layer.get("rms_norm_eps", 1e-6)))
    return DFlashShape(shape, int(layer["num_hidden_layers"]), tuple(int(k) for k in ids), block_size,
                       int(mask_token_id), **extra)

