"""How a typed config group's value is checked against its field (seal/config.py): the field's
type and its bounds, each failure one line naming the key as the YAML spells it. The groups
themselves, and every read of the composed config, stay in seal/config.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints


def at_least(low: int | float, why: str = "") -> Any:
    """A field bounded below (``why``: what the bound's value means, e.g. "0: never")."""
    return field(metadata={"min": low, "why": why})


def check_fields(obj: Any, keys: Mapping[str, str]) -> None:
    """Each field of the frozen dataclass ``obj`` as its type has it, or ValueError naming its key."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        # object.__setattr__: the one place a frozen instance takes a value (an int given for a float)
        object.__setattr__(obj, f.name, checked(keys[f.name], hints[f.name], getattr(obj, f.name), f.metadata))


def checked(key: str, hint: Any, value: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` as the field's type has it, or ValueError naming the key."""
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ValueError(f"{key} must be {' or '.join(choices)}, got {value!r}")
        return value
    if hint is bool and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{key} must be a number, got {value!r}")
        value = float(value)
    if hint == (str | None) and value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a path or null, got {value!r}")
    if hint == (int | None) and value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} must be an integer or null, got {value!r}")
    if hint == (float | None) and value is not None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            what = "a number of seconds" if key.endswith("_s") else "a number"
            raise ValueError(f"{key} must be {what} or null, got {value!r}")
        value = float(value)
    if value is None:
        return value
    why = f" ({meta['why']})" if meta.get("why") else ""
    if "min" in meta and value < meta["min"]:
        raise ValueError(f"{key} must be >= {meta['min']}{why}, got {value!r}")
    if "above" in meta and value <= meta["above"]:
        raise ValueError(f"{key} must be > {meta['above']}, got {value!r}")
    return value
