"""GRPO group advantages and diagnosis-guided reweighting (A-Patch), pure functions.

DESIGN.md sections 3 and 6. Inputs are plain sequences so these run and test
without torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from env_pool import tags as T

GRPO_EPS = 1e-6  # added to the group std (unbiased, n-1), as verl does
SCALE_MIN, SCALE_MAX = 0.5, 2.0

# Released-code base weights (DESIGN.md section 3).
RELEASED_BASE_WEIGHTS: dict[str, float] = {
    T.SPURIOUS_TOOL_CALL: 2.0,
    T.CORRECT_ABSTENTION: 1.8,
    T.EMPTY_TURN: 1.5,
    T.STATE_MISMATCH: 1.0,
    T.RESPONSE_MISMATCH: 0.9,
    T.INSTANCE_MISMATCH: 0.6,
    T.PASS: 1.0,
    T.UNKNOWN: 1.0,
}
# Paper-vocabulary base weights: not published; ours, chosen to mirror the
# released ordering (direct failures and skipped calls up-weighted), and
# overridable in config.
PAPER_BASE_WEIGHTS: dict[str, float] = {
    T.INVALID_TOOL_CALL: 2.0,
    T.MISSING_TOOL_CALL: 1.5,
    T.ARGUMENT_MISMATCH: 1.2,
    T.RECOVERY_FAILURE: 1.2,
    T.STATE_MISMATCH: 1.0,
    T.RESPONSE_MISMATCH: 0.9,
    T.PASS: 1.0,
    T.UNKNOWN: 1.0,
}


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: list[float]
    zero_variance: bool


def grpo_advantages(rewards: Sequence[float], eps: float = GRPO_EPS) -> GroupAdvantages:
    """(r - mean) / (std + eps) within one group; a group whose rewards are all
    equal carries no signal: zero advantages, flagged so it can be counted."""
    n = len(rewards)
    if n == 0:
        raise ValueError("a group needs at least one reward")
    mean = sum(rewards) / n
    if n == 1 or all(r == rewards[0] for r in rewards):
        return GroupAdvantages([0.0] * n, True)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return GroupAdvantages([(r - mean) / (std + eps) for r in rewards], False)


def trajectory_scale(
    tags: Sequence[str],
    weights: Mapping[str, float],
    excluded: frozenset[str] = T.EXCLUDED_TAGS,
    lo: float = SCALE_MIN,
    hi: float = SCALE_MAX,
) -> float:
    """w_j: mean tag weight over the trajectory's turns (excluded tags left
    out, unknown tags weigh weights['unknown'] or 1), clipped; 1.0 if untagged."""
    used = [t for t in tags if t not in excluded]
    if not used:
        return 1.0
    default = weights.get(T.UNKNOWN, 1.0)
    w = sum(weights.get(t, default) for t in used) / len(used)
    return min(hi, max(lo, w))


def apply_scale(advantage: float, scale: float, apply_to: str = "all") -> float:
    """A <- w A on the selected side; w > 0 so the sign never changes."""
    if scale <= 0:
        raise ValueError(f"A-Patch scale must be positive, got {scale}")
    if apply_to == "all" or (apply_to == "positive" and advantage > 0) or (apply_to == "negative" and advantage < 0):
        return scale * advantage
    if apply_to not in ("all", "positive", "negative"):
        raise ValueError(f"apply_to must be all, positive or negative, got {apply_to!r}")
    return advantage
