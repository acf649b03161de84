"""A small built-in verifiable tool environment for fast learning tests.

One user turn, three tools, short prompts: a tiny model can sometimes earn the
reward, so a learning signal shows within a few updates. The verifier is
exact: reward 1 iff the expected tool was called with the expected arguments
and no other tool was called. Same episode API, step loop
(env_pool/multi_turn.py), formats and training interface as BFCL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from env_pool import tags as T
from env_pool.base import Message
from env_pool.interface.feedback import tool_error_hint, unknown_tool_hint
from env_pool.interface.prompt import tool_prompt
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import MultiTurnEnv, Verdict
from env_pool.tasks import IndexedSplits
from env_pool.tool_calls import Signatures, ToolCall, render_calls
from env_pool.tool_functions import ToolSet

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


def add(a: int, b: int) -> dict[str, int]:
    """Add two integers.

    a: First number.
    b: Second number.
    """
    return {"result": a + b}


def multiply(a: int, b: int) -> dict[str, int]:
    """Multiply two integers.

    a: First number.
    b: Second number.
    """
    return {"result": a * b}


def get_weather(city: str) -> dict[str, str]:
    """Current weather of a city.

    city: City name.
    """
    return {"weather": WEATHER.get(city, "unknown")}


# The toy executor reads arguments by name; positional ones bind in parameter order.
TOOLS = ToolSet(add, multiply, get_weather)
_EXAMPLE = ToolCall("add", {"a": 1, "b": 2})
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
SPLITS = IndexedSplits("toy_", num_train=200, num_tasks=300, name="toy")
TASK_PREFIX = SPLITS.prefix


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
    index = SPLITS.index(task_id)  # a KeyError names the ids there are
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


def _matches(call: ToolCall, expected: ToolCall) -> bool:
    if call.name != expected.name:
        return False
    if call.name in ("add", "multiply") and set(call.arguments) == {"a", "b"}:
        return sorted(map(repr, call.arguments.values())) == sorted(map(repr, expected.arguments.values()))
    return call.arguments == expected.arguments


class ToyToolEnv(MultiTurnEnv[ToyTask]):
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

    def task_ids(self, split: str = "all") -> list[str]:
        return SPLITS.ids(split)

    def system_prompt(self, interface: InterfaceState) -> str:
        example = render_calls([_EXAMPLE], self.tool_format)
        intro = "You are a helpful assistant with tools."
        return tool_prompt(intro, example, TOOLS.schemas, interface, after="Then answer the user in plain text.")

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return [[render_calls([toy_task(task_id).expected], self.tool_format), "Here is the answer."]]

    def user_messages(self, turn: int) -> list[Message]:
        return [{"role": "user", "content": self.task.question}]

    # ------------------------------------------------------------ hooks
    def load_task(self, task_id: str) -> ToyTask:
        return toy_task(task_id)

    def open_episode(self, task: ToyTask) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": self.system_prompt(self.interface)}]
        if self.few_shot:
            for question, call, result, answer in FEW_SHOT:
                messages += [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": render_calls([call], self.tool_format)},
                    {"role": "tool", "name": call.name, "content": result},
                    {"role": "assistant", "content": answer},
                ]
        return messages + self.user_messages(0)

    def signatures(self) -> Signatures:
        return TOOLS.signatures

    def tool_names(self, turn: int) -> list[str]:
        return list(TOOLS.names)

    def execute(self, call: ToolCall, turn: int) -> str:
        hint: str | None
        if call.name not in TOOLS.by_name:
            result = f"Error during execution: name '{call.name}' is not defined"
            hint = unknown_tool_hint(call.name, TOOLS.names)
        else:
            result = TOOLS.execute(call)
            hint = tool_error_hint(result) if '"error"' in result else None
        return f"{result}\n{hint}" if hint and self.interface.error_feedback else result

    def judge(self) -> Verdict:
        task = self.task
        calls = [c for step in self.parsed_turns[0] for c in step.calls]
        hit = any(_matches(c, task.expected) for c in calls)
        wrong_tool = any(c.name != task.expected.name for c in calls)
        reward = int(hit and not wrong_tool)
        if reward:
            tag = label = T.PASS
        elif not calls:
            tag = T.EMPTY_TURN
            label = T.INVALID_TOOL_CALL if any(step.error for step in self.parsed_turns[0]) else T.MISSING_TOOL_CALL
        elif wrong_tool:
            # The toy has no API instances or state: under the release rule the
            # one check left, the response, is what fails ("classes": a call
            # to a tool other than the expected one is the scope error).
            tag = T.INSTANCE_MISMATCH if self.instance_mismatch == "classes" else T.RESPONSE_MISMATCH
            label = T.INVALID_TOOL_CALL if any(c.name not in TOOLS.by_name for c in calls) else T.RESPONSE_MISMATCH
        else:
            tag, label = T.RESPONSE_MISMATCH, T.ARGUMENT_MISMATCH
        return Verdict(reward, float(reward), (tag,), (label,), None if reward else "toy:" + tag)
