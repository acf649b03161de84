"""The thermostat's tools, its state and its tasks: everything the environment plays, no SEAL code
but the ToolCall record and the argument check.

A home has four rooms, each at a temperature. Two tools: ``get_temperature(room)`` and
``set_temperature(room, celsius)``. A task is two user turns with, per turn, the calls a correct
agent makes (the ground truth; an empty tuple: the turn expects no call). Tasks are made from
their index alone, so a task id always means the same task on every process.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from env_pool.schema import argument_problems
from env_pool.tool_calls import ToolCall

ROOMS = ("kitchen", "bedroom", "office", "bathroom")
MIN_C, MAX_C = 10, 30
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "get_temperature",
        "description": "The current temperature of a room, in degrees Celsius.",
        "parameters": {
            "type": "dict",
            "properties": {"room": {"type": "string", "enum": list(ROOMS), "description": "The room."}},
            "required": ["room"],
        },
    },
    {
        "name": "set_temperature",
        "description": "Set a room's thermostat.",
        "parameters": {
            "type": "dict",
            "properties": {
                "room": {"type": "string", "enum": list(ROOMS), "description": "The room."},
                "celsius": {"type": "integer", "description": f"Degrees Celsius, {MIN_C} to {MAX_C}."},
            },
            "required": ["room", "celsius"],
        },
    },
)
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
SCHEMAS = {t["name"]: t for t in TOOLS}
SIGNATURES = {t["name"]: tuple(t["parameters"]["properties"]) for t in TOOLS}  # positional arguments bind in order

# Task ids: the prefix tells every part of SEAL which environment a task belongs to.
TASK_PREFIX = "thermo_"
CATEGORIES = ("set", "adjust")
NUM_TASKS, NUM_TRAIN = 300, 200
_THANKS = ("Thanks, that is all.", "Great, thank you!")


def error_result(message: str) -> str:
    return json.dumps({"error": message})


def is_error(result: str) -> bool:
    return result.startswith('{"error"')


@dataclass
class Home:
    """The API instance: room -> degrees. The verifier compares two of them (model and truth)."""

    temperatures: dict[str, int] = field(default_factory=dict)

    def execute(self, call: ToolCall) -> str:
        """Run one call; a bad call comes back as an error result the model can read, never an exception."""
        if call.name not in SCHEMAS:
            return error_result(f"unknown tool {call.name!r}")
        problems = argument_problems(call.arguments, SCHEMAS[call.name])
        if problems:
            return error_result("; ".join(problems))
        room = call.arguments["room"]
        if call.name == "get_temperature":
            return json.dumps({"room": room, "celsius": self.temperatures[room]})
        celsius = call.arguments["celsius"]
        if not MIN_C <= celsius <= MAX_C:
            return error_result(f"celsius must be {MIN_C} to {MAX_C}, got {celsius}")
        self.temperatures[room] = celsius
        return json.dumps({"room": room, "celsius": celsius})


@dataclass(frozen=True)
class Turn:
    user: str
    expected: tuple[ToolCall, ...]


@dataclass(frozen=True)
class ThermostatTask:
    id: str
    category: str
    initial: tuple[tuple[str, int], ...]  # the home before the first turn
    turns: tuple[Turn, ...]

    @property
    def num_turns(self) -> int:
        return len(self.turns)


def task_ids(split: str) -> list[str]:
    ranges = {"train": range(NUM_TRAIN), "test": range(NUM_TRAIN, NUM_TASKS), "all": range(NUM_TASKS)}
    if split not in ranges:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(ranges)}")
    return [f"{TASK_PREFIX}{i}" for i in ranges[split]]


def get_task(task_id: str) -> ThermostatTask:
    index = int(task_id.removeprefix(TASK_PREFIX)) if task_id.removeprefix(TASK_PREFIX).isdigit() else -1
    if not task_id.startswith(TASK_PREFIX) or not 0 <= index < NUM_TASKS:
        raise KeyError(f"unknown thermostat task id {task_id!r} ({TASK_PREFIX}0 .. {TASK_PREFIX}{NUM_TASKS - 1})")
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
            Turn(rng.choice(_THANKS), ()),
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
    return ThermostatTask(task_id, category, tuple(sorted(initial.items())), turns)


def category_of(task_id: str) -> str:
    """A task's category; a KeyError names an unknown id."""
    return get_task(task_id).category
