"""Which components a config names (identity only, no rules): their short names, what the
proposer declares of itself, the second model it loads, the adapters and the batch size (the
last three as `specpipe.settings` resolves them, re-exported here for the readers of a config)."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe.declaration import Declaration, declaration_of
from specpipe.settings import batch_size, draft_model_name, lora_paths

__all__ = ["batch_size", "declared", "draft_model_name", "kind_of", "lora_paths", "proposer_kind"]


def kind_of(node: DictConfig) -> str:
    """A component's short name, from its build function (specpipe.proposers.ngram.build -> ngram)."""
    target = node.get("_target_") or "none"
    return target.split(".")[-2] if "." in target else target


def proposer_kind(cfg: DictConfig) -> str:
    return declared(cfg).name


def declared(cfg: DictConfig) -> Declaration:
    """What the config's proposer declares of itself (specpipe/declaration.py)."""
    return declaration_of(cfg.proposer)
