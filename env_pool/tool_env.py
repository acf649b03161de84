"""ToolEnv: an environment on the shared step loop whose tools are Python functions, so that what
every environment wrote again is written once (docs/custom-environment.md).

A subclass gives its ``kind``, its ``splits`` (task ids by index: ``task_ids``, ``task_prefix``), its
``tools`` (a ``ToolSet``), an ``intro`` for the system prompt, ``task_of`` (a task id's task: a
``TurnTask``) and ``judge``. From those it gets the system prompt with the training interface's
parts, the executor with the interface's error hints, the user turns, ``category_of``, and a
correct agent's steps from each turn's expected calls and reply. A stateful env also gives
``new_state(task)``: the object whose methods are its tools, one per episode (``self.state``).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from env_pool.base import Message, TokenCounter
from env_pool.interface.examples import placeholder_exchange
from env_pool.interface.feedback import tool_error_hint, unknown_tool_hint
from env_pool.interface.prompt import AFTER_CALL, tool_prompt
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import MultiTurnEnv
from env_pool.tasks import IndexedSplits, TurnTask
from env_pool.tool_calls import Signatures, ToolCall, render_calls
from env_pool.tool_functions import ToolSet, is_error_result

TurnTaskT = TypeVar("TurnTaskT", bound=TurnTask)


class ToolEnv(MultiTurnEnv[TurnTaskT]):
    splits: ClassVar[IndexedSplits]  # the task ids, split by index; its prefix is the task_prefix
    tools: ClassVar[ToolSet]
    intro: ClassVar[str] = "You are a helpful assistant with tools."  # the system prompt's first sentence
    after: ClassVar[str] = AFTER_CALL  # what to do once a tool answered
    example: ClassVar[ToolCall | None] = None  # the call the prompt shows (None: the first tool, placeholder values)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "splits" in vars(cls) and "task_prefix" not in vars(cls):
            cls.task_prefix = cls.splits.prefix

    def __init__(
        self,
        tool_format: str = "python",
        step_limit: int = 2,
        instance_mismatch: str = "release",
        max_context_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        """The env config's keys (``tool_format``, ``step_limit``, ...) are these parameters."""
        super().__init__(tool_format, step_limit, instance_mismatch, max_context_tokens, token_counter)
        self.state: Any = None

    # ------------------------------------------------------------ what a subclass writes
    @classmethod
    @abc.abstractmethod
    def task_of(cls, task_id: str) -> TurnTaskT:
        """The task of ``task_id``, the same on every process (make it from ``cls.splits.index(task_id)``);
        a KeyError names an unknown id."""

    def new_state(self, task: TurnTaskT) -> object:
        """The episode's tool state: the object whose methods are the tools (None: plain functions)."""
        return None

    # ------------------------------------------------------------ what it gets
    @classmethod
    def category_of(cls, task_id: str) -> str:
        return cls.task_of(task_id).category

    def task_ids(self, split: str = "all") -> list[str]:
        return self.splits.ids(split)

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        """Calls as the model writes them in the env's tool format (the prompt's example, the reference)."""
        return render_calls(list(calls), self.tool_format)

    def system_prompt(self, interface: InterfaceState, category: str | None = None) -> str:
        example = self.example
        if example is None:
            exchange = placeholder_exchange(self.tools.schemas)
            example = exchange[1] if exchange else ToolCall(self.tools.names[0], {})
        return tool_prompt(self.intro, self.call_text([example]), self.tools.schemas, interface, category, self.after)

    def reference_turns(self, task_id: str) -> list[list[str]]:
        """Per user turn: the expected calls (if any), then the turn's reply, which ends it."""
        turns = self.task_of(task_id).turns
        return [([self.call_text(t.expected)] if t.expected else []) + [t.reply] for t in turns]

    def load_task(self, task_id: str) -> TurnTaskT:
        return self.task_of(task_id)

    def open_episode(self, task: TurnTaskT) -> list[Message]:
        self.state = self.new_state(task)
        return [
            {"role": "system", "content": self.system_prompt(self.interface, task.category)},
            *self.user_messages(0),
        ]

    def user_messages(self, turn: int) -> list[Message]:
        return [{"role": "user", "content": self.task.turns[turn].user}]

    def signatures(self) -> Signatures:
        return self.tools.signatures

    def tool_names(self, turn: int) -> list[str]:
        return list(self.tools.names)

    def execute(self, call: ToolCall, turn: int) -> str:
        """The tool's result; under ``error_feedback`` an error result gets the interface's hint line."""
        result = self.tools.execute(call, self.state)
        if not self.interface.error_feedback or not is_error_result(result):
            return result
        if call.name not in self.tools.by_name:
            hint: str | None = unknown_tool_hint(call.name, self.tools.names)
        else:
            hint = tool_error_hint(json.loads(result)["error"])
        return f"{result}\n{hint}" if hint else result

    def release(self) -> None:
        self.state = None  # the episode's tool state goes with it
