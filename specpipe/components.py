"""Components by name: the `_target_` a component config names, called or looked up.

A leaf: the build, the checks and the recipe reader all find components through it, so none of
them needs another, and nothing here recognises a component by its name. Only build functions
under `specpipe.` are called, because a recipe found beside a model is data from a stranger.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from specpipe.errors import SpecpipeError
from specpipe.paths import conf_dir


def call_target(node: DictConfig, group: str, context):
    """Call the build function a component config names, with its keys as keyword arguments
    (context: the build's runtime facts, `build.BuildContext`; None where only options are checked)."""
    kwargs = OmegaConf.to_container(node, resolve=True)
    target = kwargs.pop("_target_", None)
    if target is None:
        return None
    if not isinstance(target, str) or not target.startswith("specpipe."):
        raise SpecpipeError(
            f"{group}._target_={target!r} is refused: only build functions under `specpipe.` are "
            "called. Pick a built-in component (see conf/) instead of naming code to run."
        )
    module, _, name = target.rpartition(".")
    try:
        build = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise SpecpipeError(f"{group}._target_={target} does not exist in this specpipe version.") from None
    try:
        return build(context=context, **kwargs)
    except TypeError as err:
        if "keyword argument" not in str(err):
            raise
        raise SpecpipeError(
            f"{group} does not take one of the settings {sorted(kwargs)}: {err}. Check the key's "
            f"spelling against conf/{group}/."
        ) from None


def module_of(target) -> ModuleType | None:
    """The module of a `_target_` (None: not a specpipe build function, or not importable)."""
    if not isinstance(target, str) or not target.startswith("specpipe."):
        return None
    try:
        return importlib.import_module(target.rpartition(".")[0])
    except (ImportError, ValueError):
        return None


def validator_of(group: str, choice: str) -> Callable[[dict], None] | None:
    """The `validate_options(options)` of conf/{group}/{choice}.yaml's component, if it has one."""
    path = conf_dir() / group / f"{choice}.yaml"
    if not path.is_file():
        return None
    module = module_of(OmegaConf.load(path).get("_target_"))
    return getattr(module, "validate_options", None)
