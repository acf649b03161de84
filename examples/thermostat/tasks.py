"""The thermostat's tools, its state and its tasks: everything the environment plays.

A home has four rooms, each at a temperature. Two tools, methods of the home (env_pool's ToolSet
reads their schemas from the type hints and docstrings): ``get_temperature(room)`` and
``set_temperature(room, celsius)``. A task is two user turns with, per turn, the calls a correct
agent makes (the ground truth; an empty tuple: the turn expects no call). Tasks are made from
their index alone, so a task id always means the same task on every process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from env_pool.tasks import IndexedSplits, Turn, TurnTask
from env_pool.tool_calls import ToolCall
from env_pool.tool_functions import ToolError, ToolSet

Room = Literal["kitchen", "bedroom", "office", "bathroom"]
ROOMS: tuple[str, ...] = get_args(Room)
MIN_C, MAX_C = 10, 30
# Task ids thermo_0 .. thermo_299: the prefix tells every part of SEAL which environment a task is of.
SPLITS = IndexedSplits("thermo_", num_train=200, num_tasks=300, name="thermostat")
_THANKS = ("Thanks, that is all.", "Great, thank you!")


@dataclass
class Home:
    """The API instance: room -> degrees. The verifier compares two of them (model and truth)."""

    temperatures: dict[str, int] = field(default_factory=dict)

    def get_temperature(self, room: Room) -> dict[str, Any]:
        """The current temperature of a room, in degrees Celsius.

        room: The room.
        """
        return {"room": room, "celsius": self.temperatures[room]}

    def set_temperature(self, room: Room, celsius: int) -> dict[str, Any]:
        """Set a room's thermostat.

        room: The room.
        celsius: Degrees Celsius, 10 to 30.
        """
        if not MIN_C <= celsius <= MAX_C:
            raise ToolError(f"celsius must be {MIN_C} to {MAX_C}, got {celsius}")  # the model reads it
        self.temperatures[room] = celsius
        return {"room": room, "celsius": celsius}


TOOLS = ToolSet(Home.get_temperature, Home.set_temperature)


@dataclass(frozen=True)
class ThermostatTask(TurnTask):
    initial: tuple[tuple[str, int], ...]  # the home before the first turn


def get_task(task_id: str) -> ThermostatTask:
    index = SPLITS.index(task_id)  # a KeyError names the ids there are
    rng = random.Random(index)
    initial = {room: rng.randint(16, 24) for room in ROOMS}
    room = rng.choice(ROOMS)
    if index % 2 == 0:  # set: one call, then a turn that expects none
        target = rng.randint(MIN_C, MAX_C)
        turns = (
            Turn(
                f"Please set the {room} to {target} degrees.",
                (ToolCall("set_temperature", {"room": room, "celsius": target}),),
            ),
            Turn(rng.choice(_THANKS)),
        )
        category = "set"
    else:  # adjust: read the room, then change it relative to what was read
        delta = rng.randint(1, 4)
        turns = (
            Turn(f"How warm is the {room} right now?", (ToolCall("get_temperature", {"room": room}),)),
            Turn(
                f"Make it {delta} degrees warmer, please.",
                (ToolCall("set_temperature", {"room": room, "celsius": initial[room] + delta}),),
            ),
        )
        category = "adjust"
    return ThermostatTask(task_id, category, turns, tuple(sorted(initial.items())))
