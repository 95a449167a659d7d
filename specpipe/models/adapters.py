"""What changes a loaded target before decoding: LoRA adapters (peft) and early exit.

One adapter is merged into the weights (so a twin built afterwards copies the adapted target,
and quantization sees merged weights). Several adapters stay separate, switched per request with
`set_adapter`; the first is active. Early exit keeps the first N decoder layers (LayerSkip-style
self-exit: the final norm and lm_head read layer N's output).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpipe.errors import Refusal, refuse


def apply_lora(model: torch.nn.Module, paths: list[str]) -> torch.nn.Module:
    if not paths:
        return model
    from peft import PeftModel

    refuse(lora_refusal(paths))
    peft_model = PeftModel.from_pretrained(model, paths[0], adapter_name="adapter0")
    if len(paths) == 1:
        return peft_model.merge_and_unload().eval()
    for i, path in enumerate(paths[1:], start=1):
        peft_model.load_adapter(path, adapter_name=f"adapter{i}")
    peft_model.set_adapter("adapter0")
    return peft_model.eval()


def apply_early_exit(model: torch.nn.Module, layers: int | None) -> torch.nn.Module:
    if layers is None:
        return model
    decoder = model.get_decoder()
    total = len(decoder.layers)
    refuse(early_exit_refusal(layers, total))
    decoder.layers = decoder.layers[:layers]
    model.config.num_hidden_layers = layers  # the KV cache is sized from the config
    return model


def lora_refusal(paths: list[str]) -> Refusal | None:
    """The first of `paths` that is not a peft adapter directory, refused (None: all are)."""
    for path in paths:
        if not (Path(path).expanduser() / "adapter_config.json").is_file():
            return Refusal(f"model.lora={path} is not a peft adapter directory (no adapter_config.json there)",
                           "pass the directory written by `PeftModel.save_pretrained`")
    return None


def early_exit_refusal(layers, total: int | None) -> Refusal | None:
    """model.early_exit=`layers` on a target of `total` decoder layers (None: unknown yet)."""
    if isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers and not (total and layers > total):
        return None
    return Refusal(f"model.early_exit={layers!r} must be a layer count between 1 and the target's "
                   f"{total or 'number of'} layers", f"use model.early_exit=1..{total or 'N'}, or null")
