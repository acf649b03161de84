"""The two per-turn diagnosis vocabularies (docs/design.md, diagnosis).

Shared by the environment (which produces tags), the learner (A-Patch weights)
and the interface (guidelines). Plain strings so they cross the wire as-is.
"""

from __future__ import annotations

# Released-code vocabulary: drives the default advantage weights.
GT_ERROR = "gt_error"
SPURIOUS_TOOL_CALL = "spurious_tool_call"
CORRECT_ABSTENTION = "correct_abstention"
EMPTY_TURN = "empty_turn_model_response"
INSTANCE_MISMATCH = "instance_mismatch"
STATE_MISMATCH = "state_mismatch"
RESPONSE_MISMATCH = "response_mismatch"
CHECKER_ERROR = "checker_error"
PASS = "pass"
UNKNOWN = "unknown"

RELEASED_TAGS: tuple[str, ...] = (
    GT_ERROR,
    SPURIOUS_TOOL_CALL,
    CORRECT_ABSTENTION,
    EMPTY_TURN,
    INSTANCE_MISMATCH,
    STATE_MISMATCH,
    RESPONSE_MISMATCH,
    CHECKER_ERROR,
    PASS,
)
# When instance_mismatch fires (config diagnosis.instance_mismatch).
# "release": never. In the released code the tag never fires with
# bfcl-eval's executor (which instantiates every involved class for the
# model and the ground truth alike), so such turns fall through to the next
# failing check (state_mismatch, then response_mismatch) and keep its weight.
# "classes": the turn failed and the model's calls acted on other API
# classes than the ground truth's (e.g. posted instead of moving a file).
INSTANCE_MISMATCH_RULES: tuple[str, ...] = ("release", "classes")


def check_instance_mismatch_rule(rule: str) -> str:
    if rule not in INSTANCE_MISMATCH_RULES:
        raise ValueError(
            f"diagnosis.instance_mismatch must be one of {', '.join(INSTANCE_MISMATCH_RULES)}, got {rule!r}"
        )
    return rule


# Tags that say nothing about the policy: excluded from weighting and profiles.
EXCLUDED_TAGS: frozenset[str] = frozenset({GT_ERROR, CHECKER_ERROR})
# Turns that count as passed for progress.
PASSING_TAGS: frozenset[str] = frozenset({PASS, CORRECT_ABSTENTION})

# Paper vocabulary (Table 5), one dominant label per turn, listed by priority.
INVALID_TOOL_CALL = "invalid_tool_call"
ARGUMENT_MISMATCH = "argument_mismatch"
RECOVERY_FAILURE = "recovery_failure"
MISSING_TOOL_CALL = "missing_tool_call"

PAPER_LABELS: tuple[str, ...] = (
    INVALID_TOOL_CALL,
    ARGUMENT_MISMATCH,
    STATE_MISMATCH,
    RECOVERY_FAILURE,
    MISSING_TOOL_CALL,
    RESPONSE_MISMATCH,
    PASS,
)

# The official checker's error types (bfcl-eval multi_turn_checker / eval_runner).
ERR_EMPTY_TURN = "multi_turn:empty_turn_model_response"
ERR_STATE = "multi_turn:instance_state_mismatch"
ERR_RESPONSE = "multi_turn:execution_response_mismatch"
ERR_FORCE_TERMINATED = "multi_turn:force_terminated"
ERR_CHECKER = "multi_turn:checker_error"


def turn_position(index: int, num_turns: int) -> str:
    """early / middle / late, for the capability state's turn-position keys."""
    if num_turns <= 1:
        return "early"
    frac = index / (num_turns - 1)
    if frac < 1 / 3:
        return "early"
    if frac <= 2 / 3:
        return "middle"
    return "late"


# A-Patch (docs/design.md): each tag's base weight, and the clip of a trajectory's weight.
# Here, beside the vocabulary, because two components read them: the coordinator's tag
# weights start from a base table and clip to these bounds, and the learner clips the
# trajectory scale to them.
SCALE_MIN, SCALE_MAX = 0.5, 2.0

# Released-code base weights.
RELEASED_BASE_WEIGHTS: dict[str, float] = {
    SPURIOUS_TOOL_CALL: 2.0,
    CORRECT_ABSTENTION: 1.8,
    EMPTY_TURN: 1.5,
    STATE_MISMATCH: 1.0,
    RESPONSE_MISMATCH: 0.9,
    INSTANCE_MISMATCH: 0.6,
    PASS: 1.0,
    UNKNOWN: 1.0,
}
# Paper-vocabulary base weights: not published; ours, chosen to mirror the
# released ordering (direct failures and skipped calls up-weighted), and
# overridable in config.
PAPER_BASE_WEIGHTS: dict[str, float] = {
    INVALID_TOOL_CALL: 2.0,
    MISSING_TOOL_CALL: 1.5,
    ARGUMENT_MISMATCH: 1.2,
    RECOVERY_FAILURE: 1.2,
    STATE_MISMATCH: 1.0,
    RESPONSE_MISMATCH: 0.9,
    PASS: 1.0,
    UNKNOWN: 1.0,
}
