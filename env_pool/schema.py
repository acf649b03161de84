"""Checks a decoded call against its tool schema (BFCL's JSON-schema dialect).

Used by the diagnosis (argument_mismatch) and by the training interface's
hints. Only structural facts a schema states: required fields, known names,
types, enums. It never consults the ground truth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# BFCL type names (plus JSON-schema spellings) -> accepted Python types.
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "float": (int, float),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "tuple": (list, tuple),
    "dict": (dict,),
    "object": (dict,),
}


def type_ok(value: Any, type_name: str | None) -> bool:
    if type_name is None or type_name == "any" or type_name not in _TYPES:
        return True
    if isinstance(value, bool) and type_name not in ("boolean",):
        return False
    return isinstance(value, _TYPES[type_name])


def argument_problems(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Human-readable problems; empty when the call fits the schema."""
    params = schema.get("parameters", {}) or {}
    props: Mapping[str, Any] = params.get("properties", {}) or {}
    required = params.get("required", []) or []
    problems: list[str] = []
    for name in required:
        if name not in arguments:
            problems.append(f"missing required argument {name!r}")
    for name, value in arguments.items():
        spec = props.get(name)
        if spec is None:
            problems.append(f"unknown argument {name!r}")
            continue
        expected = spec.get("type")
        if not type_ok(value, expected):
            problems.append(f"argument {name!r} expected {expected}, got {type(value).__name__}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            problems.append(f"argument {name!r} must be one of {spec['enum']}")
        items = spec.get("items")
        if items and isinstance(value, (list, tuple)):
            bad = [v for v in value if not type_ok(v, items.get("type"))]
            if bad:
                problems.append(f"argument {name!r} items expected {items.get('type')}")
    return problems


# BFCL's type names that are not JSON Schema's (bfcl-eval writes Python's names); "any": no type.
_JSON_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer"}


def json_schema(node: Any) -> Any:
    """A BFCL schema node in JSON Schema, as a chat template's ``tools=`` block expects it."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value != "any":
                out["type"] = _JSON_SCHEMA_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {name: json_schema(prop) for name, prop in value.items()}
        else:
            out[key] = json_schema(value)
    return out


def function_tools(docs: Any) -> list[dict[str, Any]]:
    """BFCL function docs as OpenAI-style function tools (what ``apply_chat_template(tools=...)`` takes);
    a doc's ``response`` schema is left out: no template shows it."""
    return [
        {
            "type": "function",
            "function": {
                "name": doc["name"],
                "description": doc.get("description", ""),
                "parameters": json_schema(doc.get("parameters", {"type": "dict", "properties": {}})),
            },
        }
        for doc in docs
    ]
