"""The one JSON policy for model output in every tool-call format: no duplicate keys, no NaN or
Infinity (they are not JSON, and a duplicate key would silently drop an argument)."""

from __future__ import annotations

import json
from typing import Any


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON value")


DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
