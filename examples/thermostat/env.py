"""ThermostatEnv: a complete environment of one's own, on SEAL's multi-turn step loop.

docs/custom-environment.md walks through it. What the environment supplies:

- its tasks: ``task_ids(split)``, ``kind``, ``task_prefix`` and ``category_of`` (examples/thermostat/tasks.py);
- the episode's hooks the step loop calls (``_load``, ``_open``, ``_signatures``, ``_tool_names``,
  ``_execute``, ``user_messages``) and ``reference_turns`` (a correct agent's steps);
- the verifier (``_judge``): a binary reward from the end state and the tool results, and one
  diagnosis tag per user turn in both vocabularies of env_pool/tags.py, which drive the A-Patch
  weights, the capability state and the guidelines;
- the training interface's hooks: annotated schemas and the schema line (``schema_lite``), error
  hints (``error_feedback``) and capability guidelines in the system prompt.

Select it with ``seal train env=thermostat`` (configs/env/thermostat.yaml); this folder must be
importable by every process of the run (``PYTHONPATH=$PWD``, run from the repository root).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from env_pool import tags as T
from env_pool.base import Message, Outcome
from env_pool.interface.feedback import tool_error_hint, unknown_tool_hint
from env_pool.interface.guidelines import guideline_block
from env_pool.interface.schema_lite import SYSTEM_LINE, annotate_tools
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import MultiTurnEnv
from env_pool.paper_labels import paper_label
from env_pool.tool_calls import ParsedStep, Signatures, ToolCall, render_calls
from examples.thermostat.tasks import (
    SCHEMAS,
    SIGNATURES,
    TASK_PREFIX,
    TOOL_NAMES,
    TOOLS,
    Home,
    ThermostatTask,
    category_of,
    get_task,
    is_error,
    task_ids,
)


@dataclass(frozen=True)
class Verdict:
    reward: int  # 1: every turn passed
    progress: float  # passed turns / scorable turns
    tags: tuple[str, ...]  # released vocabulary (env_pool.tags.RELEASED_TAGS), one per user turn
    labels: tuple[str, ...]  # paper vocabulary (env_pool.tags.PAPER_LABELS), one per user turn
    error_type: str | None  # why the episode failed (None: it passed)


def judge(task: ThermostatTask, turns: Sequence[Sequence[ParsedStep]], cut_off: bool) -> Verdict:
    """Replay the model's decoded calls and the ground truth's in two homes, turn by turn, without
    stopping at the first failure. A turn with expected calls passes when both homes agree (state)
    and every ground-truth result is among the model's results so far (response). A turn the episode
    never reached (``cut_off``: the step limit or the context ended it) is diagnosed as empty."""
    model, truth = Home(dict(task.initial)), Home(dict(task.initial))
    model_results: list[str] = []
    tags: list[str] = []
    labels: list[str] = []
    error_type = T.ERR_FORCE_TERMINATED if cut_off else None
    for t, turn in enumerate(task.turns):
        steps = turns[t] if t < len(turns) else ()
        calls = [c for s in steps if s.error is None for c in s.calls]
        results = [model.execute(c) for c in calls]
        model_results += results
        gt_results = [truth.execute(c) for c in turn.expected]
        state_ok = response_ok = None
        if not turn.expected:
            tag = T.SPURIOUS_TOOL_CALL if calls else T.CORRECT_ABSTENTION
        elif not calls:
            tag = T.EMPTY_TURN
        else:
            state_ok = model.temperatures == truth.temperatures
            response_ok = all(r in model_results for r in gt_results)
            tag = T.PASS if state_ok and response_ok else T.STATE_MISMATCH if not state_ok else T.RESPONSE_MISMATCH
        if error_type is None and tag in (T.EMPTY_TURN, T.STATE_MISMATCH, T.RESPONSE_MISMATCH):
            error_type = {T.EMPTY_TURN: T.ERR_EMPTY_TURN, T.STATE_MISMATCH: T.ERR_STATE}.get(tag, T.ERR_RESPONSE)
        tags.append(tag)
        labels.append(paper_label(steps, calls, turn.expected, results, state_ok, response_ok, tag, SCHEMAS, is_error))
    passed = sum(tag in T.PASSING_TAGS for tag in tags)
    return Verdict(int(error_type is None), passed / len(tags), tuple(tags), tuple(labels), error_type)


class ThermostatEnv(MultiTurnEnv):
    kind = "thermostat"  # names the environment in trajectories, metrics and errors
    task_prefix = TASK_PREFIX  # every task id starts with it (env_pool/registry.py finds the env by it)

    def __init__(self, tool_format: str = "python", step_limit: int = 2) -> None:
        """The config's keys (configs/env/thermostat.yaml) are these parameters."""
        super().__init__(tool_format, step_limit)
        self._task: ThermostatTask | None = None

    @classmethod
    def category_of(cls, task_id: str) -> str:
        return category_of(task_id)

    def task_ids(self, split: str = "all") -> list[str]:
        return task_ids(split)

    def reference_turns(self, task_id: str) -> list[list[str]]:
        """Per user turn: the expected calls (if any), then a closing plain-text step that ends the turn."""
        calls = [list(turn.expected) for turn in get_task(task_id).turns]
        return [([render_calls(c, self.tool_format)] if c else []) + ["Done."] for c in calls]

    def system_prompt(self, interface: InterfaceState, category: str) -> str:
        tools = "\n".join(json.dumps(t) for t in annotate_tools(TOOLS, interface))  # schema_lite annotates copies
        example = render_calls([ToolCall("get_temperature", {"room": "kitchen"})], self.tool_format)
        prompt = (
            "You control a home's thermostats. To use a tool, reply with only the call, for example:\n"
            f"{example}\nAfter the tool answers, reply to the user in plain text. "
            f"If the request needs no tool, reply in plain text.\nTools:\n{tools}\n"
        )
        extras = [SYSTEM_LINE] if interface.schema_lite else []
        if block := guideline_block(interface.guidelines_for(category)):  # the coordinator's guidelines
            extras.append(block)
        return prompt + ("\n" + "\n\n".join(extras) + "\n" if extras else "")

    def user_messages(self, turn: int) -> list[Message]:
        assert self._task is not None
        return [{"role": "user", "content": self._task.turns[turn].user}]

    # ------------------------------------------------------------ the step loop's hooks
    def _load(self, task_id: str) -> ThermostatTask:
        return get_task(task_id)

    def _open(self, task: ThermostatTask) -> list[Message]:
        self._home = Home(dict(task.initial))
        return [
            {"role": "system", "content": self.system_prompt(self._interface, task.category)},
            *self.user_messages(0),
        ]

    def _signatures(self) -> Signatures:
        return SIGNATURES

    def _tool_names(self, turn: int) -> list[str]:
        return list(TOOL_NAMES)

    def _execute(self, call: ToolCall, turn: int) -> str:
        result = self._home.execute(call)
        if not self._interface.error_feedback or not is_error(result):
            return result
        hint = (
            unknown_tool_hint(call.name, TOOL_NAMES)
            if call.name not in SCHEMAS
            else tool_error_hint(json.loads(result)["error"])
        )
        return f"{result}\n{hint}" if hint else result

    def _judge(self) -> Verdict:
        assert self._task is not None
        return judge(self._task, self._turn_parsed, cut_off=self._outcome != Outcome.COMPLETED)
