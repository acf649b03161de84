"""Shared by the benchmark scripts: where results go and how they are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WIDTH = 110  # a line of the written JSON, at most (unless one value is longer)


def _key(key: Any) -> str:
    """A dict key as json writes it: always a string (1 -> "1", True -> "true")."""
    return json.dumps({key: None})[1 : -len(": null}")]


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def to_json(value: Any, indent: int = 0) -> str:
    """JSON that reads like the table it came from: a dict or list of plain values on one line
    when it fits, a long list of plain values wrapped several to a line, anything else one entry
    per line. ``json.loads`` reads it as it reads ``json.dumps(value)``."""
    flat = json.dumps(value, default=str)
    pad = " " * (indent + 2)
    if (
        _scalar(value)
        or indent + len(flat) <= WIDTH
        and all(_scalar(v) for v in (value.values() if isinstance(value, dict) else value))
    ):
        return flat
    if isinstance(value, list) and all(_scalar(v) for v in value):
        lines, line = [], ""
        for item in (json.dumps(v, default=str) for v in value):
            if line and len(pad) + len(line) + len(item) + 2 > WIDTH:
                lines.append(line + ",")
                line = ""
            line = f"{line}, {item}" if line else item
        lines.append(line)
        return "[\n" + "\n".join(pad + l for l in lines) + "\n" + " " * indent + "]"
    if isinstance(value, dict):
        items = [f"{pad}{_key(k)}: {to_json(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + to_json(v, indent + 2) for v in value) + "\n" + " " * indent + "]"


def write_report(path: str, report: dict[str, Any]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_json(report) + "\n")
    print(f"wrote {out}")
