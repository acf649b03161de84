"""Deterministic tasks: each index seeds its own generator, so a task never changes.

A task has 2 or 3 user turns and, per turn, the calls a correct agent makes
(BFCL's ground truth). Categories follow BFCL's:
- base: add or remove an item, then look at the list or say thanks (a turn that expects no call);
- miss_param: the first request lacks the quantity, so the correct action is to ask
  (no call); the next user turn gives it;
- recovery: the user names the item in the plural, which the tool refuses with an
  error; the agent must read it and call again with the singular name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from env_pool.shopping.tools import MASS_ITEMS, PLURALS
from env_pool.tasks import IndexedSplits, Turn, TurnTask
from env_pool.tool_calls import ToolCall

CATEGORIES = ("base", "miss_param", "recovery")
# 240 train, 240 test (80 per category: the frozen evaluation's sample)
SPLITS = IndexedSplits("shop_", num_train=240, num_tasks=480, name="shopping")
TASK_PREFIX = SPLITS.prefix
_ITEMS = (*PLURALS, *MASS_ITEMS)
_THANKS = ("Thanks, that is all for now.", "Great, thank you!", "Perfect, thanks for the help.")
_VIEW = ("What is on my shopping list now?", "Can you show me my list?")


@dataclass(frozen=True)
class ShoppingTask(TurnTask):
    initial: tuple[tuple[str, int], ...]  # the list before the first turn


def task_ids(split: str) -> list[str]:
    return SPLITS.ids(split)


def get_task(task_id: str) -> ShoppingTask:
    return _generate(task_id, SPLITS.index(task_id))  # a KeyError names the ids there are


def category_of(task_id: str) -> str:
    """base, miss_param or recovery; a KeyError names an unknown id."""
    return get_task(task_id).category


def _add(item: str, quantity: int) -> ToolCall:
    return ToolCall("add_item", {"item": item, "quantity": quantity})


def _closing(rng: random.Random) -> Turn:
    """Look at the list (a read whose result must be reported) or say thanks (no call)."""
    if rng.random() < 0.5:
        return Turn(rng.choice(_VIEW), (ToolCall("view_list", {}),))
    return Turn(rng.choice(_THANKS))


def _generate(task_id: str, index: int) -> ShoppingTask:
    rng = random.Random(index)
    category = CATEGORIES[index % len(CATEGORIES)]
    on_list = rng.sample(_ITEMS, 2)
    initial = tuple((item, rng.randint(1, 3)) for item in on_list)
    fresh = rng.choice([i for i in _ITEMS if i not in on_list])
    quantity = rng.randint(2, 9)
    if category == "base":
        if rng.random() < 0.5:
            first = Turn(f"Please add {fresh} to my shopping list, quantity {quantity}.", (_add(fresh, quantity),))
        else:
            gone = on_list[0]
            first = Turn(f"Please remove {gone} from my shopping list.", (ToolCall("remove_item", {"item": gone}),))
        turns: tuple[Turn, ...] = (first, _closing(rng))
    elif category == "miss_param":
        turns = (
            Turn(f"Please add some {fresh} to my shopping list.", ()),
            Turn(f"{quantity} of them, please.", (_add(fresh, quantity),)),
            _closing(rng),
        )
    else:
        countable = rng.choice([i for i in PLURALS if i not in on_list])
        turns = (
            Turn(
                f"I need {quantity} {PLURALS[countable]}, please add them to my shopping list.",
                (_add(countable, quantity),),
            ),
            _closing(rng),
        )
    return ShoppingTask(task_id, category, turns, initial)
