"""Dynamic A-Patch tag weights from the capability state (docs/design.md, A-Patch).

Once per learner step, from the window (else totals) statistics:
  target = base * (1 + alpha * prevalence * (1 - reward_mean) * min(1, count / C)), clipped to [0.5, 2.0]
  weight = (1 - beta) * previous + beta * target        (previous starts at base)
``pass`` and ``unknown`` keep their base weights (a turn the env did not diagnose gives the weights
nothing to learn from: a reward-only env's advantages stay at scale 1); excluded tags weigh 1.0. A configured 0 means 0
(the released code silently replaced 0 by the default; we do not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from env_pool import tags as T
from env_pool.tags import PAPER_BASE_WEIGHTS, RELEASED_BASE_WEIGHTS, SCALE_MAX, SCALE_MIN


class HasCounts(Protocol):
    @property
    def count(self) -> int: ...

    @property
    def reward_mean(self) -> float: ...


@dataclass(frozen=True)
class DynamicWeightConfig:
    beta: float = 0.25  # EMA rate
    alpha: float = 1.0  # prevalence gain
    confidence: float = 32.0  # C: counts at which a tag's statistics are fully trusted

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if self.alpha < 0 or self.confidence < 0:
            raise ValueError("alpha and confidence must be >= 0")


def target_weight(base: float, count: int, total: int, reward_mean: float, cfg: DynamicWeightConfig) -> float:
    if total <= 0 or count <= 0:
        return min(SCALE_MAX, max(SCALE_MIN, base))
    prevalence = count / total
    trust = 1.0 if cfg.confidence == 0 else min(1.0, count / cfg.confidence)
    return min(SCALE_MAX, max(SCALE_MIN, base * (1 + cfg.alpha * prevalence * (1 - reward_mean) * trust)))


class TagWeights:
    """The current per-tag weights; ``update`` applies one EMA step."""

    def __init__(
        self,
        base: str | Mapping[str, float] = "released",
        cfg: DynamicWeightConfig = DynamicWeightConfig(),
        excluded: frozenset[str] = T.EXCLUDED_TAGS,
    ) -> None:
        if isinstance(base, str):
            tables = {"released": RELEASED_BASE_WEIGHTS, "paper": PAPER_BASE_WEIGHTS}
            if base not in tables:
                raise ValueError(f"base weights must be released, paper or a mapping, got {base!r}")
            base = tables[base]
        self.base = dict(base)
        self.cfg = cfg
        self.excluded = excluded
        self.weights: dict[str, float] = {t: (1.0 if t in excluded else w) for t, w in self.base.items()}

    def _base(self, tag: str) -> float:
        return self.base.get(tag, self.base.get(T.UNKNOWN, 1.0))

    def update(self, counts: Mapping[str, HasCounts]) -> dict[str, float]:
        total = sum(c.count for t, c in counts.items() if t not in self.excluded)
        for tag in sorted(set(self.base) | set(counts)):
            if tag in self.excluded:
                self.weights[tag] = 1.0
                continue
            if tag in (T.PASS, T.UNKNOWN):
                self.weights[tag] = self._base(tag)
                continue
            stat = counts.get(tag)
            target = target_weight(
                self._base(tag), stat.count if stat else 0, total, stat.reward_mean if stat else 0.0, self.cfg
            )
            previous = self.weights.get(tag, self._base(tag))
            self.weights[tag] = (1 - self.cfg.beta) * previous + self.cfg.beta * target
        return dict(self.weights)

    def to_dict(self) -> dict[str, float]:
        return dict(self.weights)

    def load(self, weights: Mapping[str, float]) -> None:
        self.weights = dict(weights)
