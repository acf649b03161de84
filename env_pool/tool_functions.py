"""Tools from plain Python functions: one ``ToolSet`` holds what an environment used to write four
times (the schemas, the schemas by name, the parser's signatures, the names) and runs the calls.

A tool is a function with type hints and a docstring: the docstring's first paragraph describes the
tool, a line ``name: text`` (under ``Args:`` or not) describes a parameter, a parameter with a
default is optional, ``Literal[...]`` gives allowed values. A method (first parameter ``self``) is
a tool of a stateful object: ``execute(call, state)`` runs it on the episode's instance. The schemas
are BFCL's dialect (env_pool/schema.py checks calls against them): ``integer``, ``float``,
``string``, ``boolean``, ``array``, ``dict``.

A call that names no tool, misses an argument or gives a wrong type, and a tool that raises
``ToolError`` (or ``ValueError``), all come back as ``{"error": "..."}`` text the model can read,
never as an exception; a tool's other return values come back as they are (a string) or as JSON.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from env_pool.schema import argument_problems
from env_pool.tool_calls import Signatures, ToolCall

_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "float", bool: "boolean", list: "array", dict: "dict"}
_TYPES.update({tuple: "array", Sequence: "array", Mapping: "dict"})


class ToolError(Exception):
    """Raised by a tool: its message is what the model reads (as ``{"error": message}``)."""


def error_result(message: str) -> str:
    return json.dumps({"error": message})


def is_error_result(result: str) -> bool:
    """An error result of a ToolSet (or of any env writing ``{"error": ...}`` first)."""
    return result.startswith('{"error"')


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        kinds = {_TYPES.get(type(v)) for v in args}
        if len(kinds) != 1 or None in kinds:
            raise TypeError(f"{where}: Literal values must be of one type (str, int, float or bool), got {args}")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _type_schema(rest[0], where)
    base = origin if origin is not None else hint
    if base not in _TYPES:
        raise TypeError(f"{where}: no schema type for {hint!r} (use str, int, float, bool, list, dict or Literal)")
    schema: dict[str, Any] = {"type": _TYPES[base]}
    if schema["type"] == "array" and args and args[-1] is not Ellipsis:
        schema["items"] = _type_schema(args[0], where)
    return schema


def _docs(doc: str, names: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The first paragraph, and each parameter's text from its first ``name: text`` line (continued on
    deeper lines), up to a Returns/Raises/Examples section."""
    lines = inspect.cleandoc(doc).splitlines()
    summary = " ".join(line.strip() for line in lines[: next((i for i, x in enumerate(lines) if not x.strip()), None)])
    params: dict[str, str] = {}
    current, indent = None, 0
    for line in lines:
        if re.match(r"^\s*(Returns?|Raises|Yields?|Examples?|Notes?)\s*:\s*$", line):
            break  # past the parameters: a ``name:`` line there is about something else
        m = re.match(r"^(\s*)(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if m and m[2] in names and m[2] not in params:
            current, indent = m[2], len(m[1])
            params[current] = m[3].strip()
        elif current and line.strip() and len(line) - len(line.lstrip()) > indent:
            params[current] += " " + line.strip()
        else:
            current = None
    return summary, params


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function's schema in BFCL's dialect: name, description, parameters (``self`` left out)."""
    signature = inspect.signature(fn)
    params = [p for i, p in enumerate(signature.parameters.values()) if not (i == 0 and p.name == "self")]
    hints = get_type_hints(fn, include_extras=False)
    summary, texts = _docs(fn.__doc__ or "", [p.name for p in params])
    if not summary:
        raise TypeError(f"tool {fn.__name__} has no docstring: its first paragraph is what the model reads")
    properties: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name} needs a type hint (and no *args or **kwargs)")
        properties[p.name] = _type_schema(hints[p.name], f"tool {fn.__name__}, parameter {p.name}")
        if p.name in texts:
            properties[p.name]["description"] = texts[p.name]
    required = [p.name for p in params if p.default is p.empty]
    return {
        "name": fn.__name__,
        "description": summary,
        "parameters": {"type": "dict", "properties": properties, "required": required},
    }


class ToolSet:
    """The tools of an environment, from functions (or methods of its state's class), in their order."""

    def __init__(self, *functions: Callable[..., Any]) -> None:
        if not functions:
            raise ValueError("a ToolSet needs at least one function")
        self.schemas: tuple[dict[str, Any], ...] = tuple(tool_schema(fn) for fn in functions)
        self.names: tuple[str, ...] = tuple(s["name"] for s in self.schemas)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"two tools share a name: {self.names}")
        self.by_name: dict[str, dict[str, Any]] = {s["name"]: s for s in self.schemas}
        # Positional python-format arguments bind in the function's parameter order.
        self.signatures: Signatures = {s["name"]: tuple(s["parameters"]["properties"]) for s in self.schemas}
        self._functions = dict(zip(self.names, functions))
        self._methods = {
            name for name, fn in self._functions.items() if next(iter(inspect.signature(fn).parameters), "") == "self"
        }

    def execute(self, call: ToolCall, state: object = None) -> str:
        """Run one call (a method on ``state``); every refusal is an error result, never an exception."""
        if call.name not in self.by_name:
            return error_result(f"unknown tool {call.name!r}")
        problems = argument_problems(call.arguments, self.by_name[call.name])
        if problems:
            return error_result("; ".join(problems))
        fn = self._functions[call.name]
        if call.name in self._methods and state is None:
            raise TypeError(f"tool {call.name} is a method: execute it with the episode's state")
        try:
            out = fn(state, **call.arguments) if call.name in self._methods else fn(**call.arguments)
        except (ToolError, ValueError) as exc:
            return error_result(str(exc))
        return out if isinstance(out, str) else json.dumps(out)
