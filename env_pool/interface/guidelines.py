"""phi_cap "capability guidelines": system-prompt lines from the failure profile.

A tag qualifies when it is frequent (count >= 8, prevalence >= 0.10) and
poorly rewarded (reward_mean < 0.6); the top 3 by pressure =
prevalence * (1 - reward_mean) each add one guideline (docs/design.md, the training interface).
Prevalence is a tag's share of the failure tags only: passed, abstained and
unknown turns are left out of the denominator, as in the released code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from env_pool import tags as T
from env_pool.interface.state import InterfaceState

HEADING = "Guidelines:"
TEXT = {
    "cautious_call": "Do not make up a tool call when no available tool fits the request; say so in plain text instead.",
    "active_respond": "When an available tool can do what the user asks, call it instead of only replying in text.",
    "state_aware": "Before a call that changes state, re-read the most recent tool results and act on the current state.",
    "scope": "Act only on the items, files and accounts that appear in the request or in earlier tool results.",
    "format": "Give values and answers in exactly the format the user or the tool asks for.",
}
TAG_TO_GUIDELINE = {
    T.SPURIOUS_TOOL_CALL: "cautious_call",
    T.EMPTY_TURN: "active_respond",
    T.STATE_MISMATCH: "state_aware",
    T.INSTANCE_MISMATCH: "scope",
    T.RESPONSE_MISMATCH: "format",
}
# Left out of the prevalence denominator and never a guideline's cause.
_NOT_FAILURES = frozenset({T.CHECKER_ERROR, T.GT_ERROR, T.PASS, T.CORRECT_ABSTENTION, T.UNKNOWN})


@dataclass(frozen=True)
class GuidelinePolicy:
    """The thresholds (config group guideline_policy; defaults the release's)."""

    min_count: int = 8  # a tag needs count >= min_count
    min_prevalence: float = 0.10  # and prevalence >= min_prevalence
    max_reward_mean: float = 0.6  # and reward_mean < max_reward_mean
    top_k: int = 3  # guidelines at most (0: none)

    def __post_init__(self) -> None:
        if type(self.min_count) is not int or self.min_count < 0:
            raise ValueError(f"min_count must be an integer >= 0, got {self.min_count!r}")
        if type(self.top_k) is not int or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        for name in ("min_prevalence", "max_reward_mean"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")


@dataclass(frozen=True)
class TagStat:
    """How often a tag occurred and the mean reward of trajectories with it."""

    count: int
    reward_sum: float

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0


class TagTally(Protocol):
    """What a profile's entry gives: TagStat, or the coordinator's TagCounts."""

    @property
    def count(self) -> int: ...

    @property
    def reward_mean(self) -> float: ...


def select_guidelines(profile: Mapping[str, TagTally], policy: GuidelinePolicy = GuidelinePolicy()) -> tuple[str, ...]:
    total = sum(s.count for tag, s in profile.items() if tag not in _NOT_FAILURES)
    if total <= 0:
        return ()
    scored: list[tuple[float, str]] = []
    for tag, stat in profile.items():
        if tag in _NOT_FAILURES or tag not in TAG_TO_GUIDELINE:
            continue
        prevalence = stat.count / total
        if (
            stat.count >= policy.min_count
            and prevalence >= policy.min_prevalence
            and stat.reward_mean < policy.max_reward_mean
        ):
            scored.append((prevalence * (1 - stat.reward_mean), tag))
    scored.sort(key=lambda x: (-x[0], x[1]))  # ties broken by name: deterministic
    return tuple(TAG_TO_GUIDELINE[tag] for _, tag in scored[: policy.top_k])


def evolve(
    state: InterfaceState,
    profile: Mapping[str, TagTally],
    category_profiles: Mapping[str, Mapping[str, TagTally]] | None = None,
    policy: GuidelinePolicy = GuidelinePolicy(),
) -> InterfaceState:
    """Omega_{t+1} = Evolve(Omega_t, C_t): a new version only when guidelines change."""
    if not state.guidelines:
        return state
    per_category = {cat: select_guidelines(p, policy) for cat, p in (category_profiles or {}).items()}
    return state.bumped(active_guidelines=select_guidelines(profile, policy), category_guidelines=per_category)


def guideline_block(kinds: tuple[str, ...]) -> str:
    if not kinds:
        return ""
    return HEADING + "\n" + "\n".join(f"- {TEXT[k]}" for k in kinds)
