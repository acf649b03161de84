"""Verifier and diagnosis for one BFCL episode (docs/design.md: the reward, diagnosis).

The decoded trajectory is what bfcl-eval's eval_runner checks: per turn, only
steps that decode to at least one call. We replay it and the ground truth in
two private instance sets, turn by turn, without stopping at the first
failure, and check each turn with bfcl-eval's own ``state_checker`` and
``response_checker``. The binary verdict takes the first failing turn in the
official checker's order (empty, state, response), so reward and error type
equal ``multi_turn_checker``'s (tests check this on thousands of corrupted
trajectories); the per-turn tags add what the official checker never reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from env_pool import tags as T
from env_pool.bfcl.runtime import (
    ExecCall,
    InstanceSet,
    is_error_result,
    parse_ground_truth_call,
    prepare_import,
)
from env_pool.bfcl.tasks import BfclTask
from env_pool.paper_labels import paper_label
from env_pool.tool_calls import ParsedStep

_checkers: tuple[Any, Any] | None = None


def _official_checkers() -> tuple[Any, Any]:
    global _checkers
    if _checkers is None:
        prepare_import()
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            response_checker,
            state_checker,
        )

        _checkers = (state_checker, response_checker)
    return _checkers


@dataclass(frozen=True)
class TurnDiagnosis:
    tag: str  # released-code vocabulary
    label: str  # paper vocabulary
    num_calls: int
    expected_calls: int
    state_ok: bool | None  # None: not checked (ground truth expects no call)
    response_ok: bool | None
    tool_errors: int


@dataclass(frozen=True)
class Diagnosis:
    reward: int
    error_type: str | None
    tags: tuple[str, ...]
    labels: tuple[str, ...]
    progress: float
    turns: tuple[TurnDiagnosis, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "error_type": self.error_type,
            "tags": list(self.tags),
            "labels": list(self.labels),
            "progress": self.progress,
        }


def judge(task: BfclTask, turns: Sequence[Sequence[ParsedStep]], instance_mismatch: str = "release") -> Diagnosis:
    """Verdict, tags and labels for the parsed steps of each user turn.

    ``turns`` shorter than the task means the episode was cut off (step limit
    or context overflow): the official runner fails such an entry as
    force-terminated; the missing turns are diagnosed as empty.
    ``instance_mismatch``: when that tag fires (tags.INSTANCE_MISMATCH_RULES);
    it changes tags only, never the verdict.
    """
    by_classes = T.check_instance_mismatch_rule(instance_mismatch) == "classes"
    state_checker, response_checker = _official_checkers()
    model = InstanceSet(task.initial_config, list(task.involved_classes), task.long_context)
    truth = InstanceSet(task.initial_config, list(task.involved_classes), task.long_context)
    all_model_results: list[str] = []
    diagnoses: list[TurnDiagnosis] = []
    error_type: str | None = T.ERR_FORCE_TERMINATED if len(turns) < task.num_turns else None
    if len(turns) > task.num_turns:
        raise ValueError(f"{task.id}: {len(turns)} turns given, the task has {task.num_turns}")

    for t in range(task.num_turns):
        steps = turns[t] if t < len(turns) else ()
        decoded = [s for s in steps if s.error is None and s.calls]
        calls = [c for s in decoded for c in s.calls]
        results = [model.execute(ExecCall(c.name, (), dict(c.arguments))) for c in calls]
        all_model_results.extend(results)
        gt_calls = [parse_ground_truth_call(src) for src in task.ground_truth[t]]
        gt_results = [truth.execute(c) for c in gt_calls]

        state_ok = response_ok = None
        checker_failed = False
        if gt_calls:
            try:
                state_ok = bool(state_checker(model.instances, truth.instances)["valid"])
                response_ok = bool(response_checker(all_model_results, gt_results, t)["valid"])
            except Exception:  # a checker bug must not look like a policy failure
                checker_failed = True
            if error_type is None:
                if not decoded:
                    error_type = T.ERR_EMPTY_TURN
                elif checker_failed:
                    error_type = T.ERR_CHECKER
                elif not state_ok:
                    error_type = T.ERR_STATE
                elif not response_ok:
                    error_type = T.ERR_RESPONSE

        tag = _released_tag(
            model, truth, calls, gt_calls, gt_results, decoded, state_ok, response_ok, checker_failed, by_classes
        )
        visible = {doc["name"]: doc for doc in task.tools_at_turn(t)}
        label = paper_label(
            steps=steps,
            calls=calls,
            expected=gt_calls,
            results=results,
            state_ok=state_ok,
            response_ok=response_ok,
            tag=tag,
            visible=visible,
            is_error=is_error_result,
        )
        diagnoses.append(
            TurnDiagnosis(
                tag=tag,
                label=label,
                num_calls=len(calls),
                expected_calls=len(gt_calls),
                state_ok=state_ok,
                response_ok=response_ok,
                tool_errors=sum(is_error_result(r) for r in results),
            )
        )

    tags = tuple(d.tag for d in diagnoses)
    scorable = [tag for tag in tags if tag not in T.EXCLUDED_TAGS]
    reward = int(error_type is None)
    progress = sum(tag in T.PASSING_TAGS for tag in scorable) / len(scorable) if scorable else float(reward)
    return Diagnosis(
        reward=reward,
        error_type=error_type,
        tags=tags,
        labels=tuple(d.label for d in diagnoses),
        progress=progress,
        turns=tuple(diagnoses),
    )


def _released_tag(
    model, truth, calls, gt_calls, gt_results, decoded, state_ok, response_ok, checker_failed, by_classes
) -> str:
    if any(r.startswith("Error during execution") for r in gt_results):
        return T.GT_ERROR
    if not gt_calls:
        return T.SPURIOUS_TOOL_CALL if decoded else T.CORRECT_ABSTENTION
    if not decoded:
        return T.EMPTY_TURN
    if checker_failed:
        return T.CHECKER_ERROR
    if state_ok and response_ok:
        return T.PASS
    # "classes" rule: the API classes the turn acted on differ from those the
    # ground truth acted on (e.g. posted instead of messaging): a scope error.
    # The release never gets here (see tags.INSTANCE_MISMATCH_RULES).
    if by_classes and {model.class_of(c.name) for c in calls} != {truth.class_of(c.name) for c in gt_calls}:
        return T.INSTANCE_MISMATCH
    return T.STATE_MISMATCH if not state_ok else T.RESPONSE_MISMATCH
