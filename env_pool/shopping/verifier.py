"""Verifier and diagnosis for one shopping episode, the way env_pool/bfcl/judge.py does BFCL.

Per user turn, the decoded model calls (steps that decode to at least one call)
and the ground-truth calls are replayed in two separate lists, without
stopping at the first failure. On a turn with expected calls the state check
compares the two lists and the response check asks that every ground-truth
result appears among the model's results so far (bfcl-eval's state_checker and
response_checker). The verdict is the first failing turn in the official
order (empty, state, response); as in BFCL, a call in a turn that expects none
is tagged but not failed (its effect on the list shows at the next check).
"""

from __future__ import annotations

from collections.abc import Sequence

from env_pool import tags as T
from env_pool.multi_turn import Verdict
from env_pool.paper_labels import paper_label
from env_pool.shopping.tasks import ShoppingTask
from env_pool.shopping.tools import TOOLS, ShoppingList
from env_pool.tool_calls import ParsedStep
from env_pool.tool_functions import is_error_result


def judge(
    task: ShoppingTask, turns: Sequence[Sequence[ParsedStep]], instance_mismatch: str = "release", cut_off: bool = False
) -> Verdict:
    """``cut_off`` or ``turns`` shorter than the task: the episode ended early (force-terminated,
    as bfcl-eval fails an entry its step limit stopped); the turns given are still diagnosed."""
    by_classes = T.check_instance_mismatch_rule(instance_mismatch) == "classes"
    if len(turns) > task.num_turns:
        raise ValueError(f"{task.id}: {len(turns)} turns given, the task has {task.num_turns}")
    model, truth = ShoppingList(dict(task.initial)), ShoppingList(dict(task.initial))
    model_results: list[str] = []
    error_type = T.ERR_FORCE_TERMINATED if cut_off or len(turns) < task.num_turns else None
    tags: list[str] = []
    labels: list[str] = []
    for t, turn in enumerate(task.turns):
        steps = turns[t] if t < len(turns) else ()
        decoded = [s for s in steps if s.error is None and s.calls]
        calls = [c for s in decoded for c in s.calls]
        results = [TOOLS.execute(c, model) for c in calls]
        model_results.extend(results)
        gt_results = [TOOLS.execute(c, truth) for c in turn.expected]
        state_ok = response_ok = None
        if turn.expected:
            state_ok = model.snapshot() == truth.snapshot()
            response_ok = all(r in model_results for r in gt_results)
            if error_type is None:
                error_type = (
                    T.ERR_EMPTY_TURN
                    if not decoded
                    else T.ERR_STATE
                    if not state_ok
                    else T.ERR_RESPONSE
                    if not response_ok
                    else None
                )
        tag = released_tag(turn.expected, calls, gt_results, bool(decoded), state_ok, response_ok, by_classes)
        tags.append(tag)
        label = paper_label(
            steps=steps,
            calls=calls,
            expected=turn.expected,
            results=results,
            state_ok=state_ok,
            response_ok=response_ok,
            tag=tag,
            visible=TOOLS.by_name,
            is_error=is_error_result,
        )
        labels.append(label)
    reward = int(error_type is None)
    scorable = [tag for tag in tags if tag not in T.EXCLUDED_TAGS]
    progress = sum(tag in T.PASSING_TAGS for tag in scorable) / len(scorable) if scorable else float(reward)
    return Verdict(reward, progress, tuple(tags), tuple(labels), error_type)


def released_tag(expected, calls, gt_results, decoded: bool, state_ok, response_ok, by_classes: bool) -> str:
    if any(is_error_result(r) for r in gt_results):
        return T.GT_ERROR
    if not expected:
        return T.SPURIOUS_TOOL_CALL if decoded else T.CORRECT_ABSTENTION
    if not decoded:
        return T.EMPTY_TURN
    if state_ok and response_ok:
        return T.PASS
    # One API class: an unknown tool is the only call outside the ground truth's classes.
    if by_classes and any(c.name not in TOOLS.by_name for c in calls):
        return T.INSTANCE_MISMATCH
    return T.STATE_MISMATCH if not state_ok else T.RESPONSE_MISMATCH
