"""GRPO group advantages and diagnosis-guided reweighting (A-Patch), pure functions.

docs/design.md (A-Patch). Inputs are plain sequences so these run and test
without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from env_pool import tags as T
from env_pool.tags import SCALE_MAX, SCALE_MIN

GRPO_EPS = 1e-6  # added to the group std (unbiased, n-1), as verl does


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
