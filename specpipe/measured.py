"""A recipe's `measured` block, one schema: the keys specpipe reads or writes with a meaning and
their types, checked where a recipe is read (recipe.py) and written (tune, train); a malformed
block is refused by the key it names.
"""

from __future__ import annotations

import datetime

from specpipe.errors import SpecpipeError

_NUMBER = (int, float)
_TEXT = (str, type(None))
# The keys of `measured` that specpipe reads or writes with a meaning, and their types (a tuple: any
# of them; a list: a list of that; a dict: a mapping with those keys, each optional; {str: T}: any
# keys). Keys not named here are free-form data: a record for people, read by nothing.
MEASURED = {
    "tuned_on": {"device": str, "cpu": _TEXT, "cpu_features": [str], "gpu": _TEXT, "precision": _TEXT,
                 "date": (str, datetime.date, type(None))},
    "command": str, "winner": str, "chosen": str, "why": str, "figures_from": _TEXT,
    "speedup_median": (*_NUMBER, type(None)), "gamma_mean": (*_NUMBER, type(None)),
    "acceptance_rate": (*_NUMBER, type(None)), "mean_accepted_length": (*_NUMBER, type(None)),
    "tokens_per_s": (*_NUMBER, type(None)), "baseline_tokens_per_s": (*_NUMBER, type(None)),
    "max_new_tokens": (int, type(None)), "temperature": (*_NUMBER, type(None)),
    "speedup_by_category": {str: _NUMBER},
}


def check_measured(measured: dict, where: str) -> dict:
    """`measured` if every key MEASURED names has its type; else a SpecpipeError naming the key."""
    for key, value in measured.items():
        if key in MEASURED:
            _check_shape(f"measured.{key}", value, MEASURED[key], where)
    return measured


def _check_shape(name: str, value, spec, where: str) -> None:
    if isinstance(spec, dict) and list(spec) == [str]:  # {str: T}: any keys
        ok = isinstance(value, dict)
        items = [(f"{name}.{k}", v, spec[str]) for k, v in value.items()] if ok else []
    elif isinstance(spec, dict):
        ok = isinstance(value, dict)
        items = [(f"{name}.{k}", value[k], spec[k]) for k in spec if k in value] if ok else []
    elif isinstance(spec, list):
        ok = isinstance(value, list)
        items = [(f"{name}[{i}]", v, spec[0]) for i, v in enumerate(value)] if ok else []
    else:
        kinds = spec if isinstance(spec, tuple) else (spec,)
        ok, items = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds), []
    if not ok:
        raise SpecpipeError(f"{where}: {name} must be {_kind(spec)}, not {value!r}. Fix that entry or delete it "
                            "(`measured` records the figures a recipe was made with; specpipe reads tuned_on and "
                            "gamma_mean from it), or run `specpipe tune` again for a new recipe.")
    for item in items:
        _check_shape(*item, where)


def _kind(spec) -> str:
    if isinstance(spec, dict):
        return "a mapping of numbers" if list(spec) == [str] else f"a mapping of {', '.join(spec)}"
    if isinstance(spec, list):
        return "a list of " + " or ".join(word.split(" ", 1)[1] + "s" for word in _kind(spec[0]).split(" or "))
    names = {str: "a string", int: "an integer", float: "a number", type(None): "null",
             datetime.date: "a date"}
    kinds = spec if isinstance(spec, tuple) else (spec,)
    words = list(dict.fromkeys("a number" if k in _NUMBER else names[k] for k in kinds))
    return " or ".join(words)
