"""Ground truth as assistant text: how `seal env replay-gt` drives the env."""

from __future__ import annotations

from env_pool.bfcl.runtime import keyword_form, method_class, parse_ground_truth_call
from env_pool.bfcl.tasks import BfclTask
from env_pool.tool_calls import ToolCall, render_calls

END_OF_TURN_TEXT = "Done."


def ground_truth_calls(task: BfclTask, turn: int) -> list[ToolCall]:
    calls = []
    for src in task.ground_truth[turn]:
        call = parse_ground_truth_call(src)
        owner = method_class(task.involved_classes, call.name)
        if owner is None:
            raise ValueError(f"{task.id}: ground-truth call {src!r} names no method of {task.involved_classes}")
        calls.append(ToolCall(call.name, keyword_form(call, owner)))
    return calls


def ground_truth_turns(task: BfclTask, fmt: str) -> list[list[str]]:
    """Per user turn: one step with all ground-truth calls, then a plain answer."""
    turns = []
    for t in range(task.num_turns):
        calls = ground_truth_calls(task, t)
        turns.append(([render_calls(calls, fmt)] if calls else []) + [END_OF_TURN_TEXT])
    return turns
