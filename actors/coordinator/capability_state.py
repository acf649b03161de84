"""The capability state C_t (docs/design.md): tag statistics the coordinator owns.

Per trajectory and per tag occurrence it accumulates count, successes,
reward_sum and partial (progress strictly between 0 and 1), keyed by tag, by
category, by category::tag, by turn position (early/middle/late) and by task.
It keeps a window (reset at each epoch boundary) and totals, is versioned, and
serialises exactly (JSON).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from env_pool import tags as T

FIELDS = ("count", "successes", "reward_sum", "partial")
VIEWS = ("tag", "category", "category_tag", "position", "task")


def _empty() -> dict[str, dict[str, dict[str, float]]]:
    return {view: {} for view in VIEWS}


@dataclass(frozen=True)
class TagCounts:
    count: int
    successes: int
    reward_sum: float
    partial: int

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0


class CapabilityState:
    def __init__(self) -> None:
        self.version = 0
        self.epoch = 0
        self.window = _empty()
        self.totals = _empty()

    def record(
        self, category: str, task_id: str, tags: Sequence[str], reward: float, success: bool, progress: float
    ) -> None:
        """One trajectory's per-turn tags (one occurrence per turn)."""
        partial = 0.0 < progress < 1.0
        n = len(tags)
        for i, tag in enumerate(tags):
            keys = {
                "tag": tag,
                "category": category,
                "category_tag": f"{category}::{tag}",
                "position": f"{T.turn_position(i, n)}::{tag}",
                "task": f"{task_id}::{tag}",
            }
            for store in (self.window, self.totals):
                for view, key in keys.items():
                    row = store[view].setdefault(key, {f: 0 for f in FIELDS})
                    row["count"] += 1
                    row["successes"] += int(success)
                    row["reward_sum"] += float(reward)
                    row["partial"] += int(partial)
        self.version += 1

    def end_epoch(self) -> None:
        self.window = _empty()
        self.epoch += 1
        self.version += 1

    def tag_counts(self, view: str = "tag", source: str = "auto", prefix: str = "") -> dict[str, TagCounts]:
        """Rows of one view; source 'window', 'totals' or 'auto' (window if non-empty)."""
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")
        if source == "auto":
            source = "window" if self.window["tag"] else "totals"
        store = {"window": self.window, "totals": self.totals}[source]
        return {
            key[len(prefix) :]: TagCounts(
                int(r["count"]), int(r["successes"]), float(r["reward_sum"]), int(r["partial"])
            )
            for key, r in store[view].items()
            if key.startswith(prefix)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "epoch": self.epoch,
            "window": copy.deepcopy(self.window),
            "totals": copy.deepcopy(self.totals),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapabilityState:
        state = cls()
        state.version = int(data["version"])
        state.epoch = int(data["epoch"])
        for name in ("window", "totals"):
            got = data[name]
            if set(got) != set(VIEWS):
                raise ValueError(f"capability state {name} has views {sorted(got)}, expected {sorted(VIEWS)}")
            setattr(state, name, copy.deepcopy(dict(got)))
        return state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CapabilityState) and self.to_dict() == other.to_dict()
