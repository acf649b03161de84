"""phi_schema "observation_lite": annotate copies of tool schemas.

Only states what the schema already says (which parameters are required,
which values an enum allows); never which tool or value a task needs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from env_pool.interface.state import InterfaceState

SYSTEM_LINE = (
    "Parameters marked [required] must always be given, and only tools listed above may be called: "
    "never invent a tool or a parameter that is not in the schema."
)


def annotate_tools(tools: Sequence[dict[str, Any]], interface: InterfaceState) -> list[dict[str, Any]]:
    if not interface.schema_lite:
        return list(tools)
    return [_annotate(doc, interface) for doc in tools]


def _annotate(doc: dict[str, Any], interface: InterfaceState) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    params = doc.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])
    if interface.schema_drop_optional:
        for name in [n for n in props if n not in required]:
            del props[name]
    for name, spec in props.items():
        notes = []
        if name in required:
            notes.append("[required]")
        if interface.schema_show_types and spec.get("type"):
            notes.append(f"[type: {spec['type']}]")
        if spec.get("enum"):
            notes.append("Allowed values: " + ", ".join(str(v) for v in spec["enum"]))
        if notes:
            # As the released code writes it: the description as given
            # (trailing whitespace kept), a space, the notes; no final period.
            desc = spec.get("description") or ""
            spec["description"] = (desc + " " if desc else "") + " ".join(notes)
    return doc
