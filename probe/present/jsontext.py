"""Strict JSON for every document the CLI prints and the reports write: a figure that is not a
number (NaN, infinity) is written as null, never as `NaN`, which JSON parsers reject."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def json_text(value: Any, indent: int | None = 2) -> str:
    """`value` as strict JSON text."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
