"""A small built-in verifiable tool environment for fast learning tests.

One user turn, three tools, short prompts: a tiny model can sometimes earn the
reward, so a learning signal shows within a few updates. The verifier is
exact: reward 1 iff the expected tool was called with the expected arguments
and no other tool was called. Same episode API, step loop
(env_pool/multi_turn.py), formats and training interface as BFCL.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from env_pool import tags as T
from env_pool.base import Message
from env_pool.interface.feedback import tool_error_hint, unknown_tool_hint
from env_pool.interface.guidelines import guideline_block
from env_pool.interface.schema_lite import SYSTEM_LINE, annotate_tools
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import MultiTurnEnv
from env_pool.schema import argument_problems
from env_pool.tool_calls import Signatures, ToolCall, render_calls

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Rome", "Quito")
WEATHER = {
    "Paris": "rain",
    "Tokyo": "sunny",
    "Lima": "cloudy",
    "Oslo": "snow",
    "Cairo": "hot",
    "Delhi": "humid",
    "Rome": "windy",
    "Quito": "mild",
}
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "dict",
            "properties": {
                "a": {"type": "integer", "description": "First number."},
                "b": {"type": "integer", "description": "Second number."},
            },
            "required": ["a", "b"],
        },
    },
    {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "dict",
            "properties": {
                "a": {"type": "integer", "description": "First number."},
                "b": {"type": "integer", "description": "Second number."},
            },
            "required": ["a", "b"],
        },
    },
    {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "dict",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        },
    },
)
_EXAMPLE = ToolCall("add", {"a": 1, "b": 2})
# The toy executor reads arguments by name; positional ones bind in schema order.
SIGNATURES = {t["name"]: tuple(t["parameters"]["properties"]) for t in TOOLS}
# Worked exchanges shown as earlier chat turns. Without them SmolLM2-135M never
# emits a call (0 of 192 samples at temperature 1); with them it earns the
# reward on about 21% of samples in the python format and 7% in json (96 each,
# raw interface): a learnable signal.
FEW_SHOT: tuple[tuple[str, ToolCall, str, str], ...] = (
    ("What is 3 plus 4?", ToolCall("add", {"a": 3, "b": 4}), '{"result": 7}', "3 plus 4 is 7."),
    (
        "What is the weather in Berlin right now?",
        ToolCall("get_weather", {"city": "Berlin"}),
        '{"weather": "cold"}',
        "It is cold in Berlin.",
    ),
    ("What is 6 times 7?", ToolCall("multiply", {"a": 6, "b": 7}), '{"result": 42}', "6 times 7 is 42."),
)
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
NUM_TASKS = 300
NUM_TRAIN = 200
TASK_PREFIX = "toy_"


@dataclass(frozen=True)
class ToyTask:
    id: str
    question: str
    expected: ToolCall
    category: str

    @property
    def num_turns(self) -> int:
        return 1


def toy_task(task_id: str) -> ToyTask:
    try:
        index = int(task_id.removeprefix(TASK_PREFIX))
    except ValueError:
        index = -1
    if not task_id.startswith(TASK_PREFIX) or not 0 <= index < NUM_TASKS:
        raise KeyError(f"unknown toy task id {task_id!r} ({TASK_PREFIX}0 .. {TASK_PREFIX}{NUM_TASKS - 1})")
    rng = random.Random(index)
    kind = ("add", "multiply", "get_weather")[index % 3]
    if kind == "get_weather":
        city = rng.choice(CITIES)
        return ToyTask(task_id, f"What is the weather in {city} right now?", ToolCall(kind, {"city": city}), kind)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    word = "plus" if kind == "add" else "times"
    return ToyTask(task_id, f"What is {a} {word} {b}?", ToolCall(kind, {"a": a, "b": b}), kind)


def category_of(task_id: str) -> str:
    """The tool a task expects (add, multiply or get_weather); a KeyError names an unknown id."""
    return toy_task(task_id).category


def _run_tool(call: ToolCall) -> str:
    args = call.arguments
    problems = argument_problems(args, next(t for t in TOOLS if t["name"] == call.name))
    if problems:
        return json.dumps({"error": "; ".join(problems)})
    if call.name == "add":
        return json.dumps({"result": args["a"] + args["b"]})
    if call.name == "multiply":
        return json.dumps({"result": args["a"] * args["b"]})
    return json.dumps({"weather": WEATHER.get(args["city"], "unknown")})


def _matches(call: ToolCall, expected: ToolCall) -> bool:
    if call.name != expected.name:
        return False
    if call.name in ("add", "multiply") and set(call.arguments) == {"a", "b"}:
        return sorted(map(repr, call.arguments.values())) == sorted(map(repr, expected.arguments.values()))
    return call.arguments == expected.arguments


@dataclass(frozen=True)
class ToyVerdict:
    reward: int
    progress: float
    tags: tuple[str, ...]
    labels: tuple[str, ...]
    error_type: str | None


class ToyToolEnv(MultiTurnEnv):
    kind = "toy"

    def __init__(
        self,
        tool_format: str = "python",
        step_limit: int = 3,
        few_shot: bool = True,
        instance_mismatch: str = "release",
    ) -> None:
        super().__init__(tool_format, step_limit, instance_mismatch)
        self.few_shot = few_shot
        self._task: ToyTask | None = None

    def task_ids(self, split: str = "all") -> list[str]:
        ranges = {"train": range(NUM_TRAIN), "test": range(NUM_TRAIN, NUM_TASKS), "all": range(NUM_TASKS)}
        if split not in ranges:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(ranges)}")
        return [f"{TASK_PREFIX}{i}" for i in ranges[split]]

    def system_prompt(self, interface: InterfaceState) -> str:
        tools = "\n".join(json.dumps(t) for t in annotate_tools(TOOLS, interface))
        prompt = (
            "You are a helpful assistant with tools. To use a tool, reply with only the call, for example:\n"
            f"{render_calls([_EXAMPLE], self.tool_format)}\nThen answer the user in plain text.\nTools:\n{tools}\n"
        )
        extras = ([SYSTEM_LINE] if interface.schema_lite else []) + [
            b for b in [guideline_block(interface.guidelines_for(None))] if b
        ]
        return prompt + ("\n" + "\n\n".join(extras) + "\n" if extras else "")

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return [[render_calls([toy_task(task_id).expected], self.tool_format), "Here is the answer."]]

    def user_messages(self, turn: int) -> list[Message]:
        return [{"role": "user", "content": self._task.question}]  # type: ignore[union-attr]

    # ------------------------------------------------------------ hooks
    def _load(self, task_id: str) -> ToyTask:
        return toy_task(task_id)

    def _open(self, task: ToyTask) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": self.system_prompt(self._interface)}]
        if self.few_shot:
            for question, call, result, answer in FEW_SHOT:
                messages += [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": render_calls([call], self.tool_format)},
                    {"role": "tool", "name": call.name, "content": result},
                    {"role": "assistant", "content": answer},
                ]
        return messages + self.user_messages(0)

    def _signatures(self) -> Signatures:
        return SIGNATURES

    def _tool_names(self, turn: int) -> list[str]:
        return list(TOOL_NAMES)

    def _execute(self, call: ToolCall, turn: int) -> str:
        hint: str | None
        if call.name not in TOOL_NAMES:
            result = f"Error during execution: name '{call.name}' is not defined"
            hint = unknown_tool_hint(call.name, TOOL_NAMES)
        else:
            result = _run_tool(call)
            hint = tool_error_hint(result) if '"error"' in result else None
        return f"{result}\n{hint}" if hint and self._interface.error_feedback else result

    def _judge(self) -> ToyVerdict:
        task = self._task
        assert task is not None
        calls = [c for step in self._turn_parsed[0] for c in step.calls]
        hit = any(_matches(c, task.expected) for c in calls)
        wrong_tool = any(c.name != task.expected.name for c in calls)
        reward = int(hit and not wrong_tool)
        if reward:
            tag = label = T.PASS
        elif not calls:
            tag = T.EMPTY_TURN
            label = T.INVALID_TOOL_CALL if self._num_parse_errors else T.MISSING_TOOL_CALL
        elif wrong_tool:
            # The toy has no API instances or state: under the release rule the
            # one check left, the response, is what fails ("classes": a call
            # to a tool other than the expected one is the scope error).
            tag = T.INSTANCE_MISMATCH if self.instance_mismatch == "classes" else T.RESPONSE_MISMATCH
            label = T.INVALID_TOOL_CALL if any(c.name not in TOOL_NAMES for c in calls) else T.RESPONSE_MISMATCH
        else:
            tag, label = T.RESPONSE_MISMATCH, T.ARGUMENT_MISMATCH
        return ToyVerdict(reward, float(reward), (tag,), (label,), None if reward else "toy:" + tag)
