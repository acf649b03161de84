"""The shopping list: a stateful API class, its tool schemas and its executor.

The state is what the verifier compares (as BFCL's state checker compares API
instances). Errors come back as tool results ({"error": ...}), as BFCL's API
classes return them, so a policy can read them and recover within the turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from env_pool.schema import argument_problems
from env_pool.tool_calls import ToolCall

API_CLASS = "ShoppingList"
# Items are named in the singular; users may say the plural (the recovery category).
PLURALS = {
    "apple": "apples",
    "banana": "bananas",
    "egg": "eggs",
    "tomato": "tomatoes",
    "carrot": "carrots",
    "lemon": "lemons",
    "onion": "onions",
    "potato": "potatoes",
}
MASS_ITEMS = ("milk", "bread", "rice", "cheese", "butter", "coffee", "tea", "sugar")
# Used only by the worked exchanges, never by a task (so they reveal no task's answer).
EXAMPLE_ITEMS = ("pear", "yogurt")
CATALOG = tuple(sorted((*PLURALS, *MASS_ITEMS, *EXAMPLE_ITEMS)))
MAX_QUANTITY = 20

TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "add_item",
        "description": "Add an item to the shopping list, or raise its quantity if it is already there.",
        "parameters": {
            "type": "dict",
            "properties": {
                "item": {"type": "string", "description": "Item name, singular."},
                "quantity": {"type": "integer", "description": f"How many, 1 to {MAX_QUANTITY}."},
            },
            "required": ["item", "quantity"],
        },
    },
    {
        "name": "remove_item",
        "description": "Remove an item from the shopping list.",
        "parameters": {
            "type": "dict",
            "properties": {"item": {"type": "string", "description": "Item name, as on the list."}},
            "required": ["item"],
        },
    },
    {
        "name": "view_list",
        "description": "Show the items on the shopping list with their quantities.",
        "parameters": {"type": "dict", "properties": {}, "required": []},
    },
)
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
# Positional arguments bind in schema order.
SIGNATURES = {t["name"]: tuple(t["parameters"]["properties"]) for t in TOOLS}
_SCHEMAS = {t["name"]: t for t in TOOLS}


def error_result(message: str) -> str:
    return json.dumps({"error": message})


def is_error(result: str) -> bool:
    return result.startswith('{"error"')


@dataclass
class ShoppingList:
    """One API instance: item -> quantity."""

    items: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self.items.items()))

    def execute(self, call: ToolCall) -> str:
        """Run one call; bad calls come back as error results, never exceptions."""
        if call.name not in _SCHEMAS:
            return error_result(f"unknown tool {call.name!r}")
        problems = argument_problems(call.arguments, _SCHEMAS[call.name])
        if problems:
            return error_result("; ".join(problems))
        args = call.arguments
        if call.name == "view_list":
            return json.dumps({"items": self.snapshot()})
        item = args["item"]
        if call.name == "remove_item":
            if item not in self.items:
                listed = ", ".join(self.snapshot()) or "nothing"
                return error_result(f"no such item {item!r} on the list; the list has: {listed}")
            del self.items[item]
            return json.dumps({"removed": item, "items": self.snapshot()})
        if item not in CATALOG:
            return error_result(f"unknown item {item!r}: items are named in the singular, e.g. 'apple', 'egg', 'milk'")
        quantity = args["quantity"]
        if not 1 <= quantity <= MAX_QUANTITY:
            return error_result(f"quantity must be 1 to {MAX_QUANTITY}, got {quantity}")
        self.items[item] = self.items.get(item, 0) + quantity
        return json.dumps({"added": item, "quantity": self.items[item]})
