"""Worked tool-call exchanges: a training-only interface component.

Shown as earlier chat turns before the first user turn (user asks, assistant
calls, tool answers, assistant replies), so a small model sees the call format
in use. They never reveal a task's answer: the BFCL exchange calls one of the
task's tools with placeholder values taken from its schema types and a made-up
result that is never executed; an environment may pass exchanges of its own
about other requests than its tasks'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from env_pool.tool_calls import ToolCall, render_calls

# Placeholder values by schema type: they show a value's shape, not a task's value.
_PLACEHOLDER: dict[str, Any] = {
    "string": "example",
    "integer": 1,
    "float": 1.0,
    "number": 1,
    "boolean": True,
    "array": [],
    "tuple": [],
    "dict": {},
    "object": {},
}
# (user request, call, tool result, final reply): one request, one call, one answer.
Exchange = tuple[str, ToolCall, str, str]


def placeholder_exchange(tools: Sequence[dict[str, Any]]) -> Exchange | None:
    """An exchange calling the first tool whose required parameters all have placeholders."""
    for doc in tools:
        params = doc.get("parameters") or {}
        props = params.get("properties") or {}
        required = list(params.get("required") or [])
        specs = [props.get(name) or {} for name in required]
        if all(spec.get("type") in _PLACEHOLDER for spec in specs):
            # An enum's first value (any other would be refused by the schema), else the type's placeholder.
            values = {
                name: (spec["enum"][0] if spec.get("enum") else _PLACEHOLDER[spec["type"]])
                for name, spec in zip(required, specs)
            }
            call = ToolCall(doc["name"], values)
            args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
            request = f"(Example of the call format) Please run {doc['name']}" + (f" with {args}." if args else ".")
            return request, call, '{"result": "example output"}', "Done: the tool returned example output."
    return None


def exchange_messages(exchanges: Sequence[Exchange], fmt: str, bare: bool = False) -> list[dict[str, Any]]:
    """The chat turns of the exchanges, in the active tool-call format (``bare``: see render_calls)."""
    messages: list[dict[str, Any]] = []
    for request, call, result, reply in exchanges:
        messages += [
            {"role": "user", "content": request},
            {"role": "assistant", "content": render_calls([call], fmt, bare)},
            {"role": "tool", "name": call.name, "content": result},
            {"role": "assistant", "content": reply},
        ]
    return messages
