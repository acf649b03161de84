"""The paper's one dominant label per turn (by priority: docs/design.md, diagnosis), shared by every
env's judge: the env supplies which tools were visible and what counts as an error result."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from env_pool import tags as T
from env_pool.schema import argument_problems


def paper_label(
    *,
    steps: Sequence[Any],
    calls: Sequence[Any],
    expected: Sequence[Any],
    results: Sequence[str],
    state_ok: bool | None,
    response_ok: bool | None,
    tag: str,
    visible: Mapping[str, dict],
    is_error: Callable[[str], bool],
) -> str:
    """One turn's label from its evidence, by keyword: ``steps`` (decoded), ``calls`` (the model's),
    ``expected`` (the ground truth's), ``results`` (of the model's calls), the state and response
    checks (None: not run), the turn's released ``tag``, ``visible`` (tool name -> schema the model
    could call this turn) and ``is_error`` (the env's error-result test)."""
    invalid = any(s.error is not None for s in steps) or any(c.name not in visible for c in calls)
    if not expected:
        # Any call where no tool fits the request is an invalid tool call.
        return T.INVALID_TOOL_CALL if calls else T.PASS
    if tag == T.PASS or (state_ok and response_ok and calls):
        return T.PASS
    if invalid:
        return T.INVALID_TOOL_CALL
    if not calls:
        return T.MISSING_TOOL_CALL
    if any(argument_problems(c.arguments, visible[c.name]) for c in calls):
        return T.ARGUMENT_MISMATCH
    model_names, gt_names = Counter(c.name for c in calls), Counter(c.name for c in expected)
    if model_names == gt_names:
        # Right tools, and the turn failed: the arguments are what differ.
        return T.ARGUMENT_MISMATCH
    if state_ok is False:
        return T.STATE_MISMATCH
    if any(is_error(r) for r in results):
        return T.RECOVERY_FAILURE
    if not (model_names - gt_names) and (gt_names - model_names):
        return T.MISSING_TOOL_CALL
    return T.RESPONSE_MISMATCH
