"""Which components a config names (identity only, no rules): their short names, what the
proposer declares of itself, the second model it loads, the adapters and the batch size."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe.declaration import Declaration, declaration_of


def kind_of(node: DictConfig) -> str:
    """A component's short name, from its build function (specpipe.proposers.ngram.build -> ngram)."""
    target = node.get("_target_") or "none"
    return target.split(".")[-2] if "." in target else target


def proposer_kind(cfg: DictConfig) -> str:
    return declared(cfg).name


def declared(cfg: DictConfig) -> Declaration:
    """What the config's proposer declares of itself (specpipe/declaration.py)."""
    return declaration_of(cfg.proposer)


def draft_model_name(cfg: DictConfig) -> str | None:
    """The second model a proposer loads (its declared option), or None."""
    option = declared(cfg).draft_model
    return str(cfg.proposer[option]) if option not in (None, "target") else None


def lora_paths(cfg: DictConfig) -> list[str]:
    lora = cfg.model.get("lora")
    if lora is None:
        return []
    return [str(lora)] if isinstance(lora, str) else [str(p) for p in lora]


def batch_size(cfg: DictConfig) -> int:
    """Sequences decoding at once: bench's concurrency, generate's batch (0: its prompts, at least 1)."""
    return max(int(cfg.get("concurrency") or 1), int(cfg.get("batch") or 1))
