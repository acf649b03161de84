"""A small built-in verifiable tool environment for fast learning tests.

One user turn, three tools, short prompts: a tiny model can sometimes earn the
reward, so a learning signal shows within a few updates. The verifier is
exact: reward 1 iff the expected tool was called with the expected arguments
and no other tool was called. Same episode API, formats and training
interface as BFCL.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

from env_pool import tags as T
from env_pool.base import Environment, EpisodeResult, EpisodeStateError, Message, Outcome, StepResult
from env_pool.interface.feedback import parse_failure_hint, tool_error_hint, unknown_tool_hint
from env_pool.interface.guidelines import guideline_block
from env_pool.interface.schema_lite import SYSTEM_LINE, annotate_tools
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.schema import argument_problems
from env_pool.tool_calls import FORMATS, ToolCall, parse_step, render_calls

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Rome", "Quito")
WEATHER = {"Paris": "rain", "Tokyo": "sunny", "Lima": "cloudy", "Oslo": "snow", "Cairo": "hot", "Delhi": "humid", "Rome": "windy", "Quito": "mild"}
TOOLS: tuple[dict[str, Any], ...] = (
    {"name": "add", "description": "Add two integers.", "parameters": {"type": "dict", "properties": {"a": {"type": "integer", "description": "First number."}, "b": {"type": "integer", "description": "Second number."}}, "required": ["a", "b"]}},
    {"name": "multiply", "description": "Multiply two integers.", "parameters": {"type": "dict", "properties": {"a": {"type": "integer", "description": "First number."}, "b": {"type": "integer", "description": "Second number."}}, "required": ["a", "b"]}},
    {"name": "get_weather", "description": "Current weather of a city.", "parameters": {"type": "dict", "properties": {"city": {"type": "string", "description": "City name."}}, "required": ["city"]}},
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
    ("What is the weather in Berlin right now?", ToolCall("get_weather", {"city": "Berlin"}), '{"weather": "cold"}', "It is cold in Berlin."),
    ("What is 6 times 7?", ToolCall("multiply", {"a": 6, "b": 7}), '{"result": 42}', "6 times 7 is 42."),
)
NUM_TASKS = 300
NUM_TRAIN = 200


@dataclass(frozen=True)
class ToyTask:
    id: str
    question: str
    expected: ToolCall
    category: str


def toy_task(task_id: str) -> ToyTask:
    try:
        index = int(task_id.removeprefix("toy_"))
    except ValueError:
        index = -1
    if not task_id.startswith("toy_") or not 0 <= index < NUM_TASKS:
        raise KeyError(f"unknown toy task id {task_id!r} (toy_0 .. toy_{NUM_TASKS - 1})")
    rng = random.Random(index)
    kind = ("add", "multiply", "get_weather")[index % 3]
    if kind == "get_weather":
        city = rng.choice(CITIES)
        return ToyTask(task_id, f"What is the weather in {city} right now?", ToolCall(kind, {"city": city}), kind)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    word = "plus" if kind == "add" else "times"
    return ToyTask(task_id, f"What is {a} {word} {b}?", ToolCall(kind, {"a": a, "b": b}), kind)


def _execute(call: ToolCall) -> str:
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


class ToyToolEnv(Environment):
    kind = "toy"

    def __init__(self, tool_format: str = "python", step_limit: int = 4, few_shot: bool = True,
                 instance_mismatch: str = "release") -> None:
        super().__init__()
        self.instance_mismatch = T.check_instance_mismatch_rule(instance_mismatch)
        if tool_format not in FORMATS:
            raise ValueError(f"tool_format must be one of {FORMATS}, got {tool_format!r}")
        if step_limit < 1:
            raise ValueError(f"step_limit must be >= 1, got {step_limit}")
        self.tool_format = tool_format
        self.step_limit = step_limit
        self.few_shot = few_shot
        self._task: ToyTask | None = None
        self._done = True

    def task_ids(self, split: str = "all") -> list[str]:
        ranges = {"train": range(NUM_TRAIN), "test": range(NUM_TRAIN, NUM_TASKS), "all": range(NUM_TASKS)}
        if split not in ranges:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(ranges)}")
        return [f"toy_{i}" for i in ranges[split]]

    def system_prompt(self, interface: InterfaceState) -> str:
        tools = "\n".join(json.dumps(t) for t in annotate_tools(TOOLS, interface))
        prompt = (
            "You are a helpful assistant with tools. To use a tool, reply with only the call, for example:\n"
            f"{render_calls([_EXAMPLE], self.tool_format)}\nThen answer the user in plain text.\nTools:\n{tools}\n"
        )
        extras = ([SYSTEM_LINE] if interface.schema_lite else []) + [b for b in [guideline_block(interface.guidelines_for(None))] if b]
        return prompt + ("\n" + "\n\n".join(extras) + "\n" if extras else "")

    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]:
        self._task = toy_task(task_id)
        self._interface = interface or RAW_INTERFACE
        self._messages: list[Message] = [{"role": "system", "content": self.system_prompt(self._interface)}]
        if self.few_shot:
            for question, call, result, answer in FEW_SHOT:
                self._messages += [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": render_calls([call], self.tool_format)},
                    {"role": "tool", "name": call.name, "content": result},
                    {"role": "assistant", "content": answer},
                ]
        self._messages.append({"role": "user", "content": self._task.question})
        self._texts: list[str] = []
        self._calls: list[ToolCall] = []
        self._parse_errors = 0
        self._done = False
        self._outcome: Outcome | None = None
        self._env_seconds = 0.0
        return list(self._messages)

    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def done(self) -> bool:
        return self._done

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return [[render_calls([toy_task(task_id).expected], self.tool_format), "Here is the answer."]]

    def step(self, assistant_text: str) -> StepResult:
        if self._task is None or self._done:
            raise EpisodeStateError("step() needs an episode in progress: call reset() first")
        t0 = time.perf_counter()
        parsed = parse_step(assistant_text, self.tool_format, SIGNATURES)
        self._texts.append(assistant_text)
        self._messages.append({"role": "assistant", "content": assistant_text})
        names = [t["name"] for t in TOOLS]
        new: list[Message] = []
        end_turn = False
        if parsed.error is not None:
            self._parse_errors += 1
            if self._interface.error_feedback:
                new.append({"role": "tool", "name": "parse_error", "content": parse_failure_hint(self.tool_format, parsed.error, names)})
            else:
                end_turn = True
        elif not parsed.calls:
            end_turn = True
        for call in parsed.calls:
            self._calls.append(call)
            if call.name not in names:
                result = f"Error during execution: name '{call.name}' is not defined"
                hint = unknown_tool_hint(call.name, names)
            else:
                result = _execute(call)
                hint = tool_error_hint(result) if '"error"' in result else None
            if hint and self._interface.error_feedback:
                result = f"{result}\n{hint}"
            new.append({"role": "tool", "name": call.name, "content": result})
        self._messages.extend(new)
        if end_turn:
            self._finish(Outcome.COMPLETED)
        elif len(self._texts) >= self.step_limit:
            self._finish(Outcome.STEP_LIMIT)
        self._env_seconds += time.perf_counter() - t0
        return StepResult(new, 0, end_turn, self._done, self._outcome, len(parsed.calls), parsed.error)

    def end(self, outcome: Outcome) -> None:
        if self._task is None:
            raise EpisodeStateError("end() needs an episode: call reset() first")
        if not self._done:
            self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        self._done = True
        self._outcome = outcome
        self.stats.record(outcome, len(self._texts), len(self._calls), self._parse_errors)

    def result(self) -> EpisodeResult:
        if self._task is None or not self._done:
            raise EpisodeStateError("result() is available once the episode is done")
        task = self._task
        hit = any(_matches(c, task.expected) for c in self._calls)
        wrong_tool = any(c.name != task.expected.name for c in self._calls)
        reward = int(hit and not wrong_tool)
        if reward:
            tag = label = T.PASS
        elif not self._calls:
            tag = T.EMPTY_TURN
            label = T.INVALID_TOOL_CALL if self._parse_errors else T.MISSING_TOOL_CALL
        elif wrong_tool:
            # The toy has no API instances or state: under the release rule the
            # one check left, the response, is what fails ("classes": a call
            # to a tool other than the expected one is the scope error).
            tag = T.INSTANCE_MISMATCH if self.instance_mismatch == "classes" else T.RESPONSE_MISMATCH
            label = T.INVALID_TOOL_CALL if any(c.name not in {t["name"] for t in TOOLS} for c in self._calls) else T.RESPONSE_MISMATCH
        else:
            tag, label = T.RESPONSE_MISMATCH, T.ARGUMENT_MISMATCH
        return EpisodeResult(
            env=self.kind, task_id=task.id, category=task.category, reward=reward, success=bool(reward),
            progress=float(reward), tags=[tag], labels=[label],
            error_type=None if reward else "toy:" + tag, outcome=(self._outcome or Outcome.ABORTED).value,
            interface_version=self._interface.version, num_steps=len(self._texts), num_tool_calls=len(self._calls),
            num_parse_errors=self._parse_errors, turns=[list(self._texts)],
            env_seconds=self._env_seconds, judge_seconds=0.0,
        )
