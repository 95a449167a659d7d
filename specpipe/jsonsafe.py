"""JSON that strict parsers accept: Python's `json` writes `NaN` and `Infinity`, which are not
JSON (jq, JavaScript's JSON.parse and Go's encoding/json refuse them). A figure that is not a
finite number (a speedup over zero time, an acceptance rate of nothing drafted) is written as
null, meaning "not measured"."""

from __future__ import annotations

import json
import math


def finite(value):
    """`value` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value, **kwargs) -> str:
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def dump(value, file, **kwargs) -> None:
    json.dump(finite(value), file, allow_nan=False, **kwargs)
