"""Strict tool-call parsing for the two formats the policy may use.

Model output is untrusted: it is parsed into literal values only (str, int,
float, bool, None, lists, tuples, dicts of those). Nothing from it is ever
passed to eval or exec, and string arguments keep their text byte for byte.

Formats:
- "json": Qwen/Hermes style, one JSON object per ``<tool_call>...</tool_call>``
  block: ``{"name": "cd", "arguments": {"folder": "docs"}}``. Text outside the
  blocks is allowed (it is the model's prose).
- "python": BFCL's python-call list ``[cd(folder='docs'), ls(a=True)]``.
  Positional literals are accepted too (``cd('docs')``, as 160 ground-truth
  calls are written): bfcl-eval's executor eval()s the call on the API
  method, so Python binds them in the method's signature order. The parser
  binds them the same way, from the caller's ``signatures`` (tool name ->
  parameter names in that order), and every call leaves it in keyword form.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from env_pool.family_calls import (
    FamilyCallError,
    parse_deepseek_calls,
    parse_harmony_calls,
    parse_llama_calls,
    render_deepseek_calls,
    render_harmony_calls,
    render_llama_calls,
)
from env_pool.strict_json import DECODER as _DECODER

ToolCallFormat = Literal["json", "python", "llama_json", "deepseek", "harmony"]
# Tool name -> its parameter names in positional order.
Signatures = Mapping[str, Sequence[str]]
# json and python are SEAL's prompt-defined formats; llama_json, deepseek and harmony are model families'
# own (env_pool/family_calls.py). An env's `tool_format: auto` takes the model family's.
FORMATS: tuple[str, ...] = ("json", "python", "llama_json", "deepseek", "harmony")

_TAG_OPEN = "<tool_call>"
_TAG_CLOSE = "</tool_call>"
# A python-format step that does not start like a call is prose (end of turn),
# not a failed attempt at a call.
_PY_CALL_START = re.compile(r"^\s*(?:\[|[A-Za-z_][\w.]*\s*\()")
_MAX_TEXT = 200_000  # longer steps are rejected before parsing (bounded work)
_MAX_DEPTH = 64


class ToolCallParseError(ValueError):
    """The step tried to call a tool but is not a valid call in the format."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ParsedStep:
    """What one assistant step decodes to.

    ``calls`` empty and ``error`` None: a plain message (ends the turn).
    ``error`` set: a failed attempt at a call (BFCL drops such steps).
    """

    calls: tuple[ToolCall, ...] = ()
    error: str | None = None

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)


def parse_step(text: str, fmt: str, signatures: Signatures | None = None) -> ParsedStep:
    """Decode one assistant step; never raises for bad model output.

    ``signatures`` binds python-format positional arguments; without an entry
    for the called tool, a positional argument is a parse error."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {FORMATS}")
    if not isinstance(text, str):
        return ParsedStep(error=f"assistant step must be text, got {type(text).__name__}")
    if len(text) > _MAX_TEXT:
        return ParsedStep(error=f"step is {len(text)} characters, over the {_MAX_TEXT} limit")
    try:
        if fmt == "json":
            calls = parse_json_tool_calls(text)
        elif fmt == "python":
            if not looks_like_python_call(text):
                return ParsedStep()
            calls = parse_python_calls(text, signatures)
        else:
            calls = _family_calls(text, fmt)
    except (ToolCallParseError, FamilyCallError) as exc:
        return ParsedStep(error=str(exc))
    return ParsedStep(calls=tuple(calls))


def _family_calls(text: str, fmt: str) -> list[ToolCall]:
    parse = {"llama_json": parse_llama_calls, "deepseek": parse_deepseek_calls, "harmony": parse_harmony_calls}[fmt]
    pairs = parse(text)
    for name, args in pairs:
        _check_depth(args, f"call {name}")
    return [ToolCall(name, args) for name, args in pairs]


# ---------------------------------------------------------------- json format
def parse_json_tool_calls(text: str) -> list[ToolCall]:
    if len(text) > _MAX_TEXT:
        raise ToolCallParseError(f"step is {len(text)} characters, over the {_MAX_TEXT} limit")
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(_TAG_OPEN, pos)
        if start < 0:
            break
        # Decode the JSON value itself, so a string argument may contain any
        # text (even "</tool_call>"); only then expect the closing tag.
        body_start = _skip_ws(text, start + len(_TAG_OPEN))
        where = f"tool call {len(calls) + 1}"
        try:
            obj, body_end = _DECODER.raw_decode(text, body_start)
        except (ValueError, RecursionError) as exc:
            raise ToolCallParseError(f"{where} is not valid JSON: {exc}") from None
        close = _skip_ws(text, body_end)
        if not text.startswith(_TAG_CLOSE, close):
            raise ToolCallParseError(f"{where}: expected </tool_call> after the JSON object")
        calls.append(_json_call(obj, where))
        pos = close + len(_TAG_CLOSE)
    if not calls and _TAG_CLOSE in text:
        raise ToolCallParseError("</tool_call> without an opening <tool_call>")
    return calls


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _json_call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict):
        raise ToolCallParseError(f"{where} must be a JSON object with name and arguments")
    unknown = set(obj) - {"name", "arguments"}
    if unknown:
        raise ToolCallParseError(f"{where} has unexpected keys {sorted(unknown)}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError(f"{where} needs a non-empty string 'name'")
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolCallParseError(f"{where}: 'arguments' must be a JSON object")
    _check_depth(args, where)
    return ToolCall(name, args)


def _check_depth(value: Any, where: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise ToolCallParseError(f"{where}: arguments nest deeper than {_MAX_DEPTH}")
    if isinstance(value, dict):
        for v in value.values():
            _check_depth(v, where, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_depth(v, where, depth + 1)


# -------------------------------------------------------------- python format
def looks_like_python_call(text: str) -> bool:
    return bool(_PY_CALL_START.match(_strip_fences(text)))


def _strip_fences(text: str) -> str:
    # BFCL strips backticks, newlines and spaces around the list.
    stripped = text.strip("`\n ")
    if stripped.startswith("python\n"):
        stripped = stripped[len("python\n") :]
    return stripped


def parse_python_calls(text: str, signatures: Signatures | None = None) -> list[ToolCall]:
    if len(text) > _MAX_TEXT:
        raise ToolCallParseError(f"step is {len(text)} characters, over the {_MAX_TEXT} limit")
    src = _strip_fences(text)
    try:
        tree = ast.parse(src, mode="eval")  # parsing only: nothing is compiled or run
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolCallParseError(f"not a python call list: {exc.__class__.__name__}: {exc}") from None
    body = tree.body
    nodes: list[ast.expr]
    if isinstance(body, ast.Call):
        nodes = [body]
    elif isinstance(body, ast.List):
        nodes = list(body.elts)
    else:
        raise ToolCallParseError("expected [func(arg=value), ...] or func(arg=value)")
    return [_python_call(node, i, signatures or {}) for i, node in enumerate(nodes)]


def _python_call(node: ast.AST, index: int, signatures: Signatures) -> ToolCall:
    where = f"call {index + 1}"
    if not isinstance(node, ast.Call):
        raise ToolCallParseError(f"{where} is not a function call")
    if not isinstance(node.func, ast.Name):
        raise ToolCallParseError(f"{where}: the function must be a plain tool name")
    name = node.func.id
    positional = _positional(node, name, f"{where} ({name})", signatures)
    args = dict(positional)
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallParseError(f"{where} ({name}) uses **kwargs; give each argument by name")
        if kw.arg in positional:
            raise ToolCallParseError(f"{where} ({name}) gives argument {kw.arg!r} both by position and by name")
        if kw.arg in args:
            raise ToolCallParseError(f"{where} ({name}) repeats argument {kw.arg!r}")
        args[kw.arg] = _literal(kw.value, f"{where} ({name}) argument {kw.arg!r}", 0)
    return ToolCall(name, args)


def _positional(node: ast.Call, name: str, where: str, signatures: Signatures) -> dict[str, Any]:
    """Positional literals named by the tool's signature. (A positional after
    a keyword never gets here: ast.parse rejects it as a SyntaxError.)"""
    if not node.args:
        return {}
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise ToolCallParseError(f"{where} uses *args; give each argument as a literal")
    params = signatures.get(name)
    if params is None:
        raise ToolCallParseError(
            f"{where} has positional arguments but is not a known tool, so they cannot be bound; "
            "use name=value for every argument"
        )
    if len(node.args) > len(params):
        raise ToolCallParseError(
            f"{where} takes at most {len(params)} positional argument(s) ({', '.join(params) or 'none'}), "
            f"{len(node.args)} given"
        )
    return {p: _literal(a, f"{where} argument {p!r}", 0) for p, a in zip(params, node.args)}


def _literal(node: ast.AST, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ToolCallParseError(f"{where}: value nests deeper than {_MAX_DEPTH}")
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise ToolCallParseError(f"{where}: {value!r} is not a finite number")
            return value
        raise ToolCallParseError(f"{where}: {type(value).__name__} literals are not allowed")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = node.operand
        if isinstance(inner, ast.Constant) and type(inner.value) in (int, float):
            value = _literal(inner, where, depth + 1)
            return -value if isinstance(node.op, ast.USub) else value
        raise ToolCallParseError(f"{where}: a sign applies only to a number")
    if isinstance(node, ast.List):
        return [_literal(e, where, depth + 1) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, where, depth + 1) for e in node.elts)
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise ToolCallParseError(f"{where}: ** inside a dict is not allowed")
            key = _literal(k, where, depth + 1)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ToolCallParseError(f"{where}: dict keys must be strings or numbers")
            out[key] = _literal(v, where, depth + 1)
        return out
    raise ToolCallParseError(
        f"{where}: only literal values are allowed, got {type(node).__name__} ({ast.unparse(node)[:60]!r})"
    )


# ------------------------------------------------------------------ rendering
def render_calls(calls: list[ToolCall], fmt: str, bare: bool = False) -> str:
    """The text a model would emit for these calls (used to replay ground truth).

    ``bare``: python format, a single call without the list's brackets (``add(x=1)``); the
    parser reads both, and a small model starts a bare call far more often (docs/main-job.md)."""
    if fmt == "json":
        return "\n".join(f"{_TAG_OPEN}\n{json.dumps(c.to_dict(), ensure_ascii=False)}\n{_TAG_CLOSE}" for c in calls)
    if fmt == "python":
        inner = ", ".join(
            f"{c.name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in c.arguments.items()) + ")" for c in calls
        )
        return inner if bare and len(calls) == 1 else f"[{inner}]"
    if fmt == "llama_json":
        return render_llama_calls([(c.name, c.arguments) for c in calls])
    if fmt == "deepseek":
        return render_deepseek_calls([(c.name, c.arguments) for c in calls])
    if fmt == "harmony":
        return render_harmony_calls([(c.name, c.arguments) for c in calls])
    raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {FORMATS}")


def python_literal(value: Any, escape_parens: bool = False) -> str:
    """Python source for a literal value (round-trips through ast parsing).

    ``escape_parens`` writes "(" inside strings as an escape, so regex-based
    call rewriting (bfcl-eval's executor) cannot alter the string's text.
    """

    def lit(v: Any) -> str:
        if isinstance(v, str):
            text = repr(v)
            return text.replace("(", "\\x28") if escape_parens else text
        if isinstance(v, dict):
            return "{" + ", ".join(f"{lit(k)}: {lit(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(lit(x) for x in v) + "]"
        if isinstance(v, tuple):
            items = ", ".join(lit(x) for x in v)
            return f"({items},)" if len(v) == 1 else f"({items})"
        if v is None or isinstance(v, (bool, int, float)):
            return repr(v)
        raise TypeError(f"not a literal: {type(v).__name__}")

    return lit(value)
