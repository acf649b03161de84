"""The system prompt of a tool environment with the training interface's parts in it, written once
for every environment: the tools as JSON lines (annotated copies under ``schema_lite``), and after
the prompt the schema line and the guidelines the coordinator turned on for the task's category.
Under the raw interface the prompt is the environment's own, unchanged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from env_pool.interface.guidelines import guideline_block
from env_pool.interface.schema_lite import SYSTEM_LINE, annotate_tools
from env_pool.interface.state import InterfaceState

CALL_FORMAT = "To use a tool, reply with only the call, for example:"
AFTER_CALL = (
    "After the tool answers, reply to the user in plain text. If the request needs no tool, reply in plain text."
)


def with_interface(prompt: str, interface: InterfaceState, category: str | None = None) -> str:
    """``prompt`` followed by the interface's system-prompt parts (the schema line, the guidelines)."""
    extras = [SYSTEM_LINE] if interface.schema_lite else []
    if block := guideline_block(interface.guidelines_for(category)):
        extras.append(block)
    return prompt.rstrip("\n") + "\n\n" + "\n\n".join(extras) + "\n" if extras else prompt


def tool_prompt(
    intro: str,
    example: str,
    tools: Sequence[dict[str, Any]],
    interface: InterfaceState,
    category: str | None = None,
    after: str = AFTER_CALL,
) -> str:
    """``intro``, how to call a tool (``example``: a call rendered in the env's format), what to do
    after (``after``), then the tools, one JSON line each, and the interface's parts."""
    docs = "\n".join(json.dumps(t) for t in annotate_tools(tools, interface))
    return with_interface(f"{intro} {CALL_FORMAT}\n{example}\n{after}\nTools:\n{docs}\n", interface, category)
