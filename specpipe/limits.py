"""Upper bounds on what a user may ask for, each named with the reason it is the bound.

A size without an upper bound is a way to make specpipe allocate until the machine gives out:
a billion-element γ table, a tree of a hundred thousand children per node, a thousand KV-cache
rows for two prompts. Each rule here returns phrases for the `settings` check (one per problem,
naming the setting and its bound), so `check`, `export`, `bench` and `generate` refuse the same
values before anything loads. Integers are also held to the range of the type that stores them
(torch's int64: seeds, token counts), so a 2**70 seed is refused here, not by an overflow deep
in a tensor constructor after the weights have loaded.

It decides nothing about what fits a given model (context.py does, with the loaded runner) and
reads no weights; `machine_bytes` is the one fact it asks the machine.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

INT64 = (-(2**63), 2**63 - 1)  # torch's int64: every integer setting ends up in one (seeds, lengths, ids)
# γ draft tokens make a verify block of 1 + γ rows and a controller keeps per-position tables of
# gamma_max entries; acceptance falls geometrically with depth, so past a few dozen positions a
# draft is pure cost (the shipped recipes use γ <= 8; vLLM users rarely go past 10)
MAX_GAMMA = 64
# a tree drafts `top_k` children per expanded node (top_k² candidates scored per depth) and
# verifies `nodes` + 1 rows in one forward: past these, one step costs more than plain decoding
MAX_TREE_TOP_K = 64
MAX_TREE_NODES = 256


def integer_problems(cfg) -> list[str]:
    """Every integer anywhere in a config (component options too) inside int64."""
    low, high = INT64
    return [f"{key}={value} is outside the range of a 64-bit integer ({low} .. {high})"
            for key, value in _integers(cfg) if not low <= value <= high]


def _integers(node, prefix: str = ""):
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in items:
        name = f"{prefix}{key}" if isinstance(container, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, int) and not isinstance(value, bool):
            yield name, value
        elif isinstance(value, (dict, list)):
            yield from _integers(value, f"{name}.")


def size_problems(cfg: DictConfig) -> list[str]:
    """γ and tree sizes against their bounds (the memory a batch takes is `memory_problem`'s)."""
    problems = [f"{key}={cfg[key]} is more than {MAX_GAMMA}, the most γ specpipe drafts (a verify block of "
                f"1 + γ rows; past that a draft costs more than it can gain)"
                for key in ("gamma", "gamma_max") if _int(cfg.get(key)) and cfg[key] > MAX_GAMMA]
    controller = cfg.get("controller") or {}
    problems += [f"controller.{key}={controller[key]} is more than {MAX_GAMMA}, the most γ specpipe drafts"
                 for key in ("gamma", "gamma_max", "gamma_high")
                 if _int(controller.get(key)) and controller[key] > MAX_GAMMA and cfg.get(key) != controller[key]]
    tree = (cfg.get("proposer") or {}).get("tree")
    return problems + tree_problems(OmegaConf.to_container(tree) if OmegaConf.is_config(tree) else tree)


def tree_problems(tree) -> list[str]:
    """A tree's shape, whichever way its proposer writes it: `{top_k, nodes}` (EAGLE-2's dynamic
    tree) or a list of rank paths (Medusa's `medusa_choices`)."""
    if isinstance(tree, dict):
        bounds = {"top_k": MAX_TREE_TOP_K, "nodes": MAX_TREE_NODES}
        return [f"proposer.tree.{key}={tree[key]} is more than {bound} (a tree verifies nodes + 1 rows in one "
                f"forward and scores top_k² candidates per depth; past these a step costs more than plain decoding)"
                for key, bound in bounds.items() if _int(tree.get(key)) and tree[key] > bound]
    if not isinstance(tree, list) or not all(isinstance(p, list) for p in tree):
        return []  # not a tree's shape at all: the proposer's own check names it
    problems = []
    if len(tree) > MAX_TREE_NODES:
        problems.append(f"proposer.tree has {len(tree)} paths, more than {MAX_TREE_NODES} (each is a row of the "
                        "verify block)")
    ranks = [rank for path in tree for rank in path if _int(rank)]
    if ranks and max(ranks) >= MAX_TREE_TOP_K:
        problems.append(f"proposer.tree has the rank {max(ranks)}: ranks go from 0 (a head's best guess) to "
                        f"{MAX_TREE_TOP_K - 1}, and never reach the vocabulary's size")
    return problems


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def machine_bytes(device: str) -> int | None:
    """The memory a plan must fit in: the GPU's for cuda, the machine's RAM otherwise (None: unknown).
    `SPECPIPE_MEMORY_BYTES` lowers it (to keep specpipe inside a share of a shared machine)."""
    limit = os.environ.get("SPECPIPE_MEMORY_BYTES")
    if limit and limit.isdigit():
        return int(limit)
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_problem(estimate: int, device: str) -> str | None:
    """An estimate (weights and KV caches, from configs) above the memory there is."""
    have = machine_bytes(device)
    if have is None or estimate <= have:
        return None
    where = "the GPU has" if device == "cuda" else "this machine has"
    return (f"that is {estimate / 2**30:,.1f} GiB, and {where} {have / 2**30:,.1f} GiB: allocating it would fail "
            "part way (or swap the machine to a halt)")


def fit_slots(cfg: DictConfig, requests: int, key: str) -> str | None:
    """The rows that decode at once (the setting `key`) lowered to the requests there are, in
    `cfg` itself, so every reader (the checks' memory estimate, the JSON's config) sees the number
    used: a row without a request is memory for nothing. A note saying so when it was lowered."""
    asked = int(cfg.get(key) or 0)
    if asked <= requests:
        return None
    cfg[key] = requests
    return f"{key}={asked} with {requests} request(s): {requests} decode at once (nothing would fill the other rows)"


def cache_slots(cfg: DictConfig, target_config) -> int:
    """The KV cache slots one sequence gets: cache_len, at most the target's positions (the native
    engine allocates no more; `check_engine` says when it lowered the setting)."""
    positions = getattr(target_config, "max_position_embeddings", None)
    return min(cfg.cache_len, positions) if isinstance(positions, int) and positions > 0 else cfg.cache_len
