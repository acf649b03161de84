"""The shopping list: a stateful API class whose methods are the tools (env_pool/tool_functions.py).

The state is what the verifier compares (as BFCL's state checker compares API
instances). Errors come back as tool results ({"error": ...}), as BFCL's API
classes return them, so a policy can read them and recover within the turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from env_pool.tool_functions import ToolError, ToolSet

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


@dataclass
class ShoppingList:
    """One API instance: item -> quantity. Its methods are the tools (their docstrings, the schemas)."""

    items: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self.items.items()))

    def add_item(self, item: str, quantity: int) -> dict[str, Any]:
        """Add an item to the shopping list, or raise its quantity if it is already there.

        item: Item name, singular.
        quantity: How many, 1 to 20.
        """
        if item not in CATALOG:
            raise ToolError(f"unknown item {item!r}: items are named in the singular, e.g. 'apple', 'egg', 'milk'")
        if not 1 <= quantity <= MAX_QUANTITY:
            raise ToolError(f"quantity must be 1 to {MAX_QUANTITY}, got {quantity}")
        self.items[item] = self.items.get(item, 0) + quantity
        return {"added": item, "quantity": self.items[item]}

    def remove_item(self, item: str) -> dict[str, Any]:
        """Remove an item from the shopping list.

        item: Item name, as on the list.
        """
        if item not in self.items:
            listed = ", ".join(self.snapshot()) or "nothing"
            raise ToolError(f"no such item {item!r} on the list; the list has: {listed}")
        del self.items[item]
        return {"removed": item, "items": self.snapshot()}

    def view_list(self) -> dict[str, Any]:
        """Show the items on the shopping list with their quantities."""
        return {"items": self.snapshot()}


# Errors come back as {"error": ...} results (env_pool/tool_functions.py), as BFCL's API classes return them.
TOOLS = ToolSet(ShoppingList.add_item, ShoppingList.remove_item, ShoppingList.view_list)
