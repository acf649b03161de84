"""The replay queue: assembles complete GRPO groups under a staleness bound.

Rollouts arrive one by one (any order, possibly twice). A group is complete
when all ``group_size`` rollout indices are in; complete groups wait in FIFO
order until the learner takes a batch of ``groups_per_batch``. Staleness is
measured in policy versions, from the oldest segment of any rollout in the
group to the current version when the learner takes it: groups past
``max_staleness`` are dropped (counted) or, with ``stale_policy="downweight"``,
kept with a weight that halves per version past the bound. A duplicate
delivery (same group id and rollout index) is ignored and counted. Incomplete
groups older than ``reissue_after_s`` are handed back by ``expired()`` for the
producer to re-issue (counted); their partial rollouts are discarded, so a
group reaches the learner exactly once, whole.

With ``filter_groups="zero_variance"`` (DAPO's dynamic sampling) a group whose
rewards are all equal is set aside as it completes: its GRPO advantages are
all zero, so it would cost a learner step's compute and teach nothing. It is
handed to the producer by ``drain_filtered()`` (its slot is accounted for, its
tags still reach the failure profile) and never reaches the learner.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from replay.messages import Trajectory

FILTERS = ("none", "zero_variance")


@dataclass
class QueueStats:
    accepted: int = 0
    duplicates: int = 0
    dropped_stale: int = 0  # groups
    downweighted: int = 0  # groups
    reissued: int = 0  # groups
    abandoned: int = 0  # groups given up after a producer crash
    filtered: int = 0  # groups set aside: all rewards equal (filter_groups=zero_variance)
    batches: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Pending:
    created: float
    task_id: str
    rollouts: dict[int, Trajectory] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    group_id: str
    trajectories: list[Trajectory]
    staleness: int  # current version minus the oldest policy version in the group
    weight: float  # 1.0, or < 1 when down-weighted for staleness


class ReplayQueue:
    def __init__(
        self,
        group_size: int,
        groups_per_batch: int,
        max_staleness: int = 1,
        stale_policy: str = "drop",
        reissue_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        filter_groups: str = "none",
    ) -> None:
        if group_size < 1 or groups_per_batch < 1:
            raise ValueError("group_size and groups_per_batch must be >= 1")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if stale_policy not in ("drop", "downweight"):
            raise ValueError(f"stale_policy must be drop or downweight, got {stale_policy!r}")
        if filter_groups not in FILTERS:
            raise ValueError(f"filter_groups must be one of {', '.join(FILTERS)}, got {filter_groups!r}")
        self.filter_groups = filter_groups
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.reissue_after_s = reissue_after_s
        self.clock = clock
        self.policy_version = 0
        self.stats = QueueStats()
        self._pending: dict[str, _Pending] = {}
        self._complete: OrderedDict[str, list[Trajectory]] = OrderedDict()
        # Groups already complete, handed out, dropped or re-issued (bounded:
        # a late duplicate older than this many groups is no longer recognised).
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._closed_cap = 100_000
        self._dropped_ids: list[str] = []  # stale groups dropped since the last drain_dropped()
        self._filtered: list[Group] = []  # zero-variance groups since the last drain_filtered()

    def set_policy_version(self, version: int) -> None:
        if version < self.policy_version:
            raise ValueError(f"policy version went back from {self.policy_version} to {version}")
        self.policy_version = version

    def add(self, traj: Trajectory) -> bool:
        """False for a duplicate (or a late rollout of a closed group)."""
        gid = traj.group_id
        if gid in self._closed:
            self.stats.duplicates += 1
            return False
        if not 0 <= traj.rollout_index < self.group_size:
            raise ValueError(f"rollout index {traj.rollout_index} outside a group of {self.group_size}")
        pending = self._pending.setdefault(gid, _Pending(self.clock(), traj.task_id))
        if traj.rollout_index in pending.rollouts:
            self.stats.duplicates += 1
            return False
        pending.rollouts[traj.rollout_index] = traj
        self.stats.accepted += 1
        if len(pending.rollouts) == self.group_size:
            del self._pending[gid]
            self._close(gid)
            trajs = [pending.rollouts[i] for i in range(self.group_size)]
            if self.filter_groups == "zero_variance" and len({t.reward for t in trajs}) == 1:
                self.stats.filtered += 1
                self._filtered.append(
                    Group(gid, trajs, self.policy_version - min(t.policy_version for t in trajs), 0.0)
                )
            else:
                self._complete[gid] = trajs
        return True

    def drain_filtered(self) -> list[Group]:
        """Groups set aside by the filter since the last call (for the producer's books and the failure profile)."""
        out, self._filtered = self._filtered, []
        return out

    def _close(self, gid: str) -> None:
        self._closed[gid] = None
        if len(self._closed) > self._closed_cap:
            self._closed.popitem(last=False)

    def expired(self) -> list[tuple[str, str]]:
        """(group_id, task_id) of incomplete groups past the deadline, to re-issue."""
        now = self.clock()
        out = []
        for gid, pending in list(self._pending.items()):
            if now - pending.created >= self.reissue_after_s:
                del self._pending[gid]
                self._close(gid)
                self.stats.reissued += 1
                out.append((gid, pending.task_id))
        return out

    def abandon(self, group_id: str) -> bool:
        """Give up on a group whose producer died before finishing it: partial
        rollouts are discarded, later deliveries ignored, and True tells the
        caller to re-issue the task under a new group id. False when the group
        had already arrived whole (nothing to re-issue)."""
        if group_id in self._closed:
            return False
        self._pending.pop(group_id, None)
        self._close(group_id)
        self.stats.abandoned += 1
        return True

    def drain_dropped(self) -> list[str]:
        """Group ids dropped as stale since the last call (for the producer's books)."""
        out, self._dropped_ids = self._dropped_ids, []
        return out

    def ready(self) -> int:
        return len(self._complete)

    def take_batch(self, partial: bool = False) -> list[Group] | None:
        """The oldest ``groups_per_batch`` fresh-enough complete groups, or None;
        ``partial``: as many as there are (at least one) when fewer are ready."""
        fresh: list[Group] = []
        for gid in list(self._complete):
            trajs = self._complete[gid]
            staleness = self.policy_version - min(t.policy_version for t in trajs)
            if staleness > self.max_staleness:
                if self.stale_policy == "drop":
                    del self._complete[gid]
                    self.stats.dropped_stale += 1
                    self._dropped_ids.append(gid)
                    continue
                weight = 0.5 ** (staleness - self.max_staleness)
            else:
                weight = 1.0
            fresh.append(Group(gid, trajs, staleness, weight))
            if len(fresh) == self.groups_per_batch:
                break
        if len(fresh) < self.groups_per_batch and not (partial and fresh):
            return None
        for g in fresh:
            del self._complete[g.group_id]
            self.stats.downweighted += g.weight < 1.0
        self.stats.batches += 1
        return fresh
