"""Range and type validation: the command-level settings against their ranges, every
component's options against the types its build function declares (and its own
`validate_options`), prompts, and nan / inf anywhere."""

from __future__ import annotations

import inspect
import math
import types
import typing

from omegaconf import DictConfig, OmegaConf

from specpipe.checks.result import Check
from specpipe.components import call_target, module_of
from specpipe.engine.base import OVERLAP
from specpipe.errors import SpecpipeError
from specpipe.limits import integer_problems, size_problems


OUTPUTS = ("rich", "json", "text")  # generate's output modes


def check_prompts(prompts: list[str]) -> Check:
    if not prompts:
        return Check("prompts", "n/a", "no prompt given (generate uses the config's `prompt`)")
    if not all(prompts):
        return Check("prompts", "refuse", "a prompt is empty", 'pass the text: specpipe generate "your text" (or '
                     "prompt_file=PATH, or - for standard input)")
    return Check("prompts", "ok", f"{len(prompts)} prompt(s), taken verbatim")


def check_settings(cfg: DictConfig) -> Check:
    """The command-level numbers and choices, each against its range: what `generate`, `bench`
    and `export` would refuse, refused here once for all of them."""
    from specpipe.sampling import SamplingParams

    problems = non_finite(cfg)
    at_least = {"max_new_tokens": 1, "cache_len": 1, "batch": 0, "concurrency": 1, "requests": 0, "limit": 0,
                "warmup": 0, "gamma_min": 0, "gamma_max": 1}
    problems += [f"{key}={cfg[key]} must be at least {low}" for key, low in at_least.items()
                 if key in cfg and cfg[key] < low]
    chat = cfg.model.get("chat")
    if chat is not None and not isinstance(chat, bool):
        problems.append(f"model.chat={chat!r} must be true, false or null (null: the template when there is one)")
    if "output" in cfg and cfg.output not in OUTPUTS:
        problems.append(f"output={cfg.output} is not an output mode (use one of {', '.join(OUTPUTS)})")
    if cfg.get("overlap", "auto") not in OVERLAP:
        problems.append(f"overlap={cfg.overlap} is not a choice (use one of {', '.join(OVERLAP)}; auto: on where "
                        "device=cuda)")
    if not problems:
        try:
            SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
        except SpecpipeError as err:
            problems.append(str(err).rstrip("."))
    if cfg.get("concurrency", 1) > 1 and cfg.get("requests") == 0:  # else silently ignored
        problems.append(f"concurrency={cfg.concurrency} is the batch of a request load and needs requests=N (a "
                        "per-prompt bench decodes one prompt at a time)")
    problems += _gamma_problems(cfg) + integer_problems(cfg) + size_problems(cfg)
    if problems:
        return Check("settings", "refuse", "; ".join(problems), "fix the values named (see conf/ for the defaults)")
    return Check("settings", "ok", "every number finite and in range")


def _gamma_problems(cfg: DictConfig) -> list[str]:
    """γ within the bounds of the controller that runs: a clamped γ would make the config shown a lie."""
    node = cfg.controller
    if node.get("_target_") is None or "gamma" not in node:
        return []
    gamma, low, high = node.gamma, node.get("gamma_min", 0), node.get("gamma_max", node.gamma)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gamma, low, high)):
        return [f"gamma={gamma!r}, gamma_min={low!r} and gamma_max={high!r} must be integers"]
    if gamma < 1:
        return [f"gamma={gamma} must be at least 1 (γ draft tokens per step; proposer=none for plain decoding)"]
    if not low <= gamma <= high:
        return [f"gamma={gamma} is outside the controller's bounds gamma_min={low} .. gamma_max={high} (raise "
                f"gamma_max={gamma}, or lower gamma)"]
    return []


def non_finite(cfg: DictConfig) -> list[str]:
    """nan / inf anywhere in a config, named by key (train's settings too)."""
    return [f"{key}={value} is not a finite number" for key, value in _floats(cfg) if not math.isfinite(value)]


def _floats(node, prefix: str = ""):
    """(dotted key, value) of every float anywhere in a config: nan / inf hide in component options too."""
    container = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in items:
        name = f"{prefix}{key}" if isinstance(container, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, float):
            yield name, value
        elif isinstance(value, (dict, list)):
            yield from _floats(value, f"{name}.")


def check_options(cfg: DictConfig) -> Check:
    """Each component's options against the types its build function (or the class it builds)
    declares, and the component's own `validate_options` when it has one: `proposer.ngram_max=abc`
    or `proposer.tree=abc` is refused here, before anything loads, not as a traceback mid-build."""
    problems = []
    for group in ("proposer", "verifier", "controller"):
        target = cfg[group].get("_target_")
        if not target:
            continue
        options = OmegaConf.to_container(cfg[group], resolve=True)
        options.pop("_target_")
        module = module_of(target)  # only specpipe's own modules are imported
        build = getattr(module, str(target).rpartition(".")[2], None)
        if build is None:
            continue  # call_target refuses it by name
        hints = _option_types(build)
        problems += [f"{group}.{key}={value!r} is not {_type_name(hints[key])}" for key, value in options.items()
                     if key in hints and not _fits(value, hints[key])]
        validate = getattr(module, "validate_options", None)
        if validate is not None and not problems:
            try:
                validate(options)
            except SpecpipeError as err:
                problems.append(str(err).rstrip("."))
    if not problems:  # a controller is cheap to build and checks its own ranges (band's low <= high, ...)
        try:
            call_target(cfg.controller, "controller", None)
        except SpecpipeError as err:
            problems.append(str(err).rstrip("."))
    if problems:
        return Check("options", "refuse", "; ".join(problems), "give each option a value of its type (see conf/)")
    return Check("options", "ok", "component options have the types their components declare")


def _option_types(build) -> dict:
    """Parameter name -> annotation of a build function, and of the class it returns where it
    passes `**options` on."""
    hints = typing.get_type_hints(build)
    returned = hints.pop("return", None)
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(build).parameters.values()) and inspect.isclass(returned):
        hints = {**typing.get_type_hints(returned.__init__), **hints}
    return hints


def _fits(value, hint) -> bool:
    if hint is typing.Any or hint is inspect.Parameter.empty:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    if origin is type(None):
        return value is None
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin) if isinstance(origin, type) else True


def _type_name(hint) -> str:
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
             list: "a list", type(None): "null"}
    return " or ".join(names.get(typing.get_origin(a) or a, str(a)) for a in arms)
