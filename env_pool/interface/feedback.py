"""phi_err "tool feedback": one hint line after a parse failure or a tool error.

Hints restate the format, the schema or the error's general cause. They never
say which tool or argument value the task needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_TOOL_NAMES_PARSE = 12
MAX_TOOL_NAMES_UNKNOWN = 8
_SHORT_ERROR = 200

FORMAT_HINTS = {
    "json": 'Write each call as <tool_call>{"name": "tool_name", "arguments": {"param": "value"}}</tool_call> with valid JSON.',
    "python": "Write calls as a Python list of keyword calls: [tool_name(param='value'), other_tool(param=1)].",
    "llama_json": 'Write each call as {"name": "tool_name", "parameters": {"param": "value"}} with valid JSON.',
    "deepseek": "Write calls as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_name, "
    "then the arguments in a ```json block, then <｜tool▁call▁end｜><｜tool▁calls▁end｜>.",
    "harmony": "Call a tool with a commentary-channel message to functions.tool_name whose text is a JSON object.",
}

# (pattern on the error text, hint); the first match wins.
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"missing \d+ required (positional|keyword)(-only)? argument", re.I),
        "A required argument is missing: give every parameter the schema marks as required.",
    ),
    (re.compile(r"unexpected keyword argument", re.I), "Use only the parameter names listed in the tool's schema."),
    (
        re.compile(r"only one folder level|unsupported path", re.I),
        "Paths with several components are not accepted here: move one directory level per call.",
    ),
    # The path hint. bfcl-eval's cd says "No such directory" (older releases add
    # "You cannot use path to change directory."): the same hint as a missing
    # file, as in the released code, not the generic one.
    (
        re.compile(r"no such (file|directory)", re.I),
        "That name does not exist where you are: check the current location and its contents before using a name.",
    ),
    (
        re.compile(r"log ?in|logged in|authenticat|access token|token expired", re.I),
        "This action needs authentication first: use the matching login or authentication tool.",
    ),
    (
        re.compile(r"expected .{1,40}? got|must be (a |an )?(number|string|integer|list|dict)", re.I),
        "An argument has the wrong type: match the type the schema gives for each parameter.",
    ),
]


def parse_failure_hint(fmt: str, error: str, tool_names: Sequence[str]) -> str:
    names = list(tool_names)
    shown = ", ".join(names[:MAX_TOOL_NAMES_PARSE])
    more = f" (and {len(names) - MAX_TOOL_NAMES_PARSE} more)" if len(names) > MAX_TOOL_NAMES_PARSE else ""
    return (
        f"Your last message could not be read as a tool call ({error}). {FORMAT_HINTS.get(fmt, '')} "
        f"Available tools: {shown}{more}. If no tool fits the request, answer in plain text instead."
    )


def unknown_tool_hint(name: str, tool_names: Sequence[str]) -> str:
    names = list(tool_names)
    shown = ", ".join(names[:MAX_TOOL_NAMES_UNKNOWN])
    more = f" (and {len(names) - MAX_TOOL_NAMES_UNKNOWN} more)" if len(names) > MAX_TOOL_NAMES_UNKNOWN else ""
    return f"Hint: {name!r} is not an available tool. Available tools include: {shown}{more}."


def tool_error_hint(error: str) -> str | None:
    """A hint for a tool's error text, or None when none applies."""
    for pattern, hint in _PATTERNS:
        if pattern.search(error):
            return f"Hint: {hint}"
    if len(error) <= _SHORT_ERROR:
        return "Hint: the tool reported an error. Read it, correct the call, and try again, or explain the problem in plain text."
    return None
