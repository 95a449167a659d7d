"""What a proposer is and needs, declared in its own module (`DECLARATION`), read by the
checks, the exports, bench's peers and `specpipe train`.

Nothing outside a proposer's module recognises it by name: a new proposer is one file (its
build function, its `DECLARATION`) plus its YAML under conf/proposer/. `declaration_of(node)`
finds the declaration of a config's proposer through its `_target_` module. A proposer's
export mapping hands back an `EngineExport`, with the helpers the mappings share (models as
engines load them, SGLang's chain flags).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from specpipe.errors import SpecpipeError
from specpipe.models import zoo

TOKENIZERS = ("target", "same", "any")  # what the draft's token ids are
TREES = ("never", "option", "auto")  # when the proposer drafts a tree


@dataclass(frozen=True)
class Declaration:
    name: str  # the proposer's short name (conf/proposer/<name>.yaml)
    # target: it drafts in the target's own ids (no second tokenizer); same: a second model whose
    # tokenizer must equal the target's; any: a second model with any tokenizer (translated)
    tokenizer: str = "target"
    draft_model: str | None = None  # the option naming a second model ("model"), or "target": its own weights
    heads: bool = False  # trained heads in `proposer.heads`, checked against the target before loading
    hidden: str = "none"  # the target's hidden states it reads: none | last | layers
    # never: a chain; option: a tree when `proposer.tree` is set (refused where a chain is needed);
    # auto: a tree where the verifier and batch take one, else its best path
    tree: str = "never"
    draft_probs: bool = True  # False: no distribution (one-hot drafts: lossless, lower acceptance when sampling)
    early_stop: bool = False  # honours a controller's early stop (controller=confidence)
    lookup: bool = False  # takes proposer.lookup: prompt lookup tried first, its own drafting where nothing matches
    peer: str | None = None  # transformers' counterpart in bench (`peer=auto`)
    trainer: str | None = None  # module whose `KIND` trains it (`specpipe train proposer=<name>`)
    # engine (vllm | sglang) -> (ExportPlan) -> the engine's settings for this proposer, or None
    # (nothing to speculate with); the mapping appends what it loses to plan.warnings
    export: Mapping[str, Callable] = field(default_factory=dict)
    # heads folder -> what the checks compare with the target before anything loads: {hidden_size,
    # vocab_size, specpipe: {target}, reads_layers (the target layers whose input it reads, if any)}
    # (default: specpipe/heads/io.py's `read_config` of config.json, by the proposer's name)
    read_heads: Callable | None = None
    # (target tokenizer, draft tokenizer, target name, draft name, temperature) -> Check, for tokenizer="any"
    # (the tokenizers are None when not fetched yet: export)
    vocabulary: Callable | None = None

    def __post_init__(self):
        if self.tokenizer not in TOKENIZERS or self.tree not in TREES:
            raise ValueError(f"declaration of {self.name}: tokenizer in {TOKENIZERS}, tree in {TREES}")

    def drafts_tree(self, options: Mapping) -> bool:
        """Whether these options make it draft a tree that a chain-only verifier must refuse."""
        return self.tree == "option" and bool(options.get("tree"))


def _plain(plan) -> None:
    plan.warnings.append("proposer=none: nothing to speculate with; the command serves the plain target.")


NONE = Declaration("none", export={"vllm": _plain, "sglang": _plain})


def declaration_of(node: DictConfig | Mapping) -> Declaration:
    """The declaration of the proposer a config node names (`none` for plain decoding)."""
    target = node.get("_target_")
    if not target:
        return NONE
    module = str(target).rpartition(".")[0]
    try:
        found = getattr(importlib.import_module(module), "DECLARATION", None)
    except ImportError:
        found = None
    if not isinstance(found, Declaration):
        raise SpecpipeError(f"proposer._target_={target}: its module declares no proposer (no DECLARATION). Pick "
                            "one of conf/proposer/.")
    return found


def declared_proposers() -> dict[str, Declaration]:
    """Every proposer of conf/proposer/, by its YAML's name."""
    from omegaconf import OmegaConf

    from specpipe.paths import conf_dir

    found = {}
    for path in sorted((conf_dir() / "proposer").glob("*.yaml")):
        found[path.stem] = declaration_of(OmegaConf.load(path))
    return found


@dataclass
class EngineExport:
    engine: str  # vllm | sglang
    version: str  # the engine version whose keys the settings follow
    settings: dict  # vLLM: the speculative_config; SGLang: flag -> value
    command: str  # the serve command, ready to paste
    warnings: list[str] = field(default_factory=list)


def sglang_chain(gamma: int) -> dict:
    """SGLang's flags for a chain of γ draft tokens: top-k 1, and the verified token counts as one
    of the draft tokens (as SGLang forces for top-k 1)."""
    return {"--speculative-num-steps": gamma, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": gamma + 1}


def engine_model(name: str) -> str:
    """A zoo name as its hub id; a local path made absolute; a hub id as is."""
    if name in zoo.ZOO:
        return zoo.ZOO[name].hub_id
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def batch_refusal(*, target_engine: str | None = None, translated: bool = False,
                  draft_engine: str | None = None) -> str | None:
    """Why a batch runs one sequence at a time, or None (it batches): the one rule, which
    `specpipe check` applies to a config before anything loads and the decode loop to the built
    parts. target_engine / draft_engine: the engine a model runs on where it has no batch rows
    (None: it has); translated: its drafts are re-tokenised. Trees batch: each row's
    parents are its own (drafts.py)."""
    if target_engine is not None:
        return f"the target runs on the {target_engine} engine, which has no batch rows (engine=native has)"
    if translated:
        return "a draft with another tokenizer re-tokenises each sequence's text on its own"
    if draft_engine is not None:
        return f"the draft runs on the {draft_engine} engine, which decodes one sequence at a time"
    return None
