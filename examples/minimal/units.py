"""The smallest environment of one's own: unit conversion, one tool, partial credit.

docs/custom-environment.md walks through it; units.yaml beside it is its config:

    seal train env=examples/minimal/units.yaml model=tiny trainer.steps=2 trainer.filter_groups=none
"""

from __future__ import annotations

import random
import re

from env_pool.tasks import IndexedSplits, Turn, TurnTask
from env_pool.tool_calls import ToolCall
from env_pool.tool_env import ToolEnv
from env_pool.tool_functions import ToolError, ToolSet

FACTORS = {("km", "mi"): 0.621371, ("kg", "lb"): 2.204623, ("l", "gal"): 0.264172, ("m", "ft"): 3.28084}


def convert(value: float, unit_from: str, unit_to: str) -> float:
    """Convert a quantity from one unit to another.

    value: The quantity.
    unit_from: Its unit: km, kg, l or m.
    unit_to: The unit wanted: mi, lb, gal or ft.
    """
    if (unit_from, unit_to) not in FACTORS:
        raise ToolError(f"cannot convert {unit_from} to {unit_to}")  # the model reads it
    return round(value * FACTORS[unit_from, unit_to], 4)


class UnitsEnv(ToolEnv[TurnTask]):
    kind = "units"  # names it in trajectories, metrics and errors
    splits = IndexedSplits("units_", num_train=150, num_tasks=200)  # task ids units_0 .. units_199
    tools = ToolSet(convert)
    intro = "You convert units. Give the answer as a number."

    @classmethod
    def task_of(cls, task_id: str) -> TurnTask:
        rng = random.Random(cls.splits.index(task_id))  # the same task on every process
        (unit_from, unit_to), value = rng.choice(sorted(FACTORS)), float(rng.randint(1, 500))
        call = ToolCall("convert", {"value": value, "unit_from": unit_from, "unit_to": unit_to})
        question = f"How many {unit_to} is {value:g} {unit_from}?"
        return TurnTask(task_id, unit_from, (Turn(question, (call,), str(convert(value, unit_from, unit_to))),))

    def judge(self) -> float:
        """The reward alone: 1 within 1% of the answer, 0.5 within 10%, else 0 (no diagnosis tags)."""
        steps = self.parsed_turns[-1]
        if not steps or steps[-1].calls or steps[-1].error:  # no final answer in plain text
            return 0.0
        numbers = re.findall(r"-?\d+(?:\.\d+)?", self.turn_texts[-1][-1])
        right = float(self.task.turns[0].reply)
        error = abs(float(numbers[-1]) - right) / right if numbers else 1.0
        return 1.0 if error <= 0.01 else 0.5 if error <= 0.1 else 0.0
