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

Infra faults (an episode the system ended: ``Trajectory.infra_fault``) never count
as the policy's: a complete group's faulted members leave every statistic. With at
least ``min_group_size`` members left the group goes on (filter and GRPO statistics
over those); each faulted member's place is taken by a ``padding`` stand-in (its
sibling's prompt, nothing generated, outside the statistics: learner/batch.py), so
the learner's groups keep their size. With fewer, the group is handed back by
``drain_faulted()`` for the producer to re-issue (the slot ledger's bounded retries).
A rollout with a non-finite behaviour logprob is made such a fault as it arrives
(``generation_error``, counted in ``nonfinite_refused``): one NaN in a loss makes the
weights NaN for good.

Token books (``stats``): generated tokens of rollouts discarded here without a group
fate (partials of expired or abandoned groups, late rollouts of closed groups) are
counted in ``lost_tokens``; ``undecided_tokens()`` says what is still waiting.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from replay.messages import InfraFault, Trajectory

log = logging.getLogger(__name__)

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
    infra_failed: int = 0  # episodes the system ended (infra faults), in complete groups
    fault_reissued: int = 0  # groups handed back: fewer than min_group_size members without a fault
    lost_tokens: int = 0  # generated tokens of rollouts discarded without a group fate (see the module doc)
    nonfinite_refused: int = 0  # rollouts with a non-finite behaviour logprob, made infra faults (never trained)


@dataclass
class _Pending:
    created: float
    task_id: str
    rollouts: dict[int, Trajectory] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    group_id: str
    trajectories: list[Trajectory]  # what the learner gets: members without a fault, stand-ins in faulted places
    staleness: int  # current version minus the oldest policy version in the group
    weight: float  # 1.0, or < 1 when down-weighted for staleness
    faulted: tuple[Trajectory, ...] = ()  # members the system ended: out of every statistic

    @property
    def members(self) -> list[Trajectory]:
        """The members the policy played to the end (no stand-ins, no faulted ones)."""
        return [t for t in self.trajectories if not t.padding]


def stand_in(sibling: Trajectory, faulted: Trajectory) -> Trajectory:
    """A faulted member's place in a group that trains on the rest: the sibling's prompt (shared by
    the group, so shared-prefix packing forwards nothing more), nothing generated, no reward."""
    keep = sibling.prompt_length if sibling.prompt_length >= 2 else len(sibling.token_ids)
    return replace(
        sibling,
        rollout_index=faulted.rollout_index,
        token_ids=list(sibling.token_ids[:keep]),
        loss_mask=[0] * keep,
        logprobs=[0.0] * keep,
        prompt_length=min(sibling.prompt_length, keep),
        segments=[],
        reward=0.0,
        success=False,
        progress=0.0,
        tags=[],
        labels=[],
        error_type=None,
        outcome=faulted.outcome,
        num_tool_calls=0,
        num_steps=0,
        timings={},
        infra_fault=None,
        num_parse_errors=0,
        padding=True,
    )


def _oldest_version(trajs: list[Trajectory]) -> int:
    return min(t.policy_version for t in trajs if not t.padding)


class ReplayQueue:
    def __init__(
        self,
        group_size: int,
        groups_per_batch: int,
        max_staleness: int = 1,
        stale_policy: str = "drop",
        *,
        reissue_after_s: float,  # trainer.reissue_after_s (configs/config.yaml)
        clock: Callable[[], float] = time.monotonic,
        filter_groups: str = "none",
        min_group_size: int | None = None,
    ) -> None:
        """``min_group_size``: members without an infra fault a group needs to train (None: all)."""
        if group_size < 1 or groups_per_batch < 1:
            raise ValueError("group_size and groups_per_batch must be >= 1")
        min_group_size = group_size if min_group_size is None else min_group_size
        if not 1 <= min_group_size <= group_size:
            raise ValueError(f"min_group_size must be in [1, {group_size}] (the group size), got {min_group_size}")
        self.min_group_size = min_group_size
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
        self._complete: OrderedDict[str, tuple[list[Trajectory], tuple[Trajectory, ...]]] = OrderedDict()
        # Groups already complete, handed out, dropped or re-issued (bounded:
        # a late duplicate older than this many groups is no longer recognised).
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._closed_cap = 100_000
        self._dropped: list[Group] = []  # stale groups dropped since the last drain_dropped()
        self._filtered: list[Group] = []  # zero-variance groups since the last drain_filtered()
        self._faulted: list[Group] = []  # groups short of min_group_size since the last drain_faulted()

    def set_policy_version(self, version: int) -> None:
        if version < self.policy_version:
            raise ValueError(f"policy version went back from {self.policy_version} to {version}")
        self.policy_version = version

    def add(self, traj: Trajectory) -> bool:
        """False for a duplicate (or a late rollout of a closed group)."""
        gid = traj.group_id
        if gid in self._closed:
            self.stats.duplicates += 1
            self.stats.lost_tokens += traj.num_generated_tokens  # a straggler of a group given up (or a replay)
            return False
        if not 0 <= traj.rollout_index < self.group_size:
            raise ValueError(f"rollout index {traj.rollout_index} outside a group of {self.group_size}")
        pending = self._pending.setdefault(gid, _Pending(self.clock(), traj.task_id))
        if traj.rollout_index in pending.rollouts:
            self.stats.duplicates += 1
            return False
        pending.rollouts[traj.rollout_index] = self._refuse_nonfinite(traj)
        self.stats.accepted += 1
        if len(pending.rollouts) == self.group_size:
            del self._pending[gid]
            self._close(gid)
            self._completed(gid, [pending.rollouts[i] for i in range(self.group_size)])
        return True

    def _refuse_nonfinite(self, traj: Trajectory) -> Trajectory:
        """A rollout with a non-finite behaviour logprob (a broken replica's) is refused: ended by the
        system (a generation_error), so it reaches no loss, no statistic, no reward figure."""
        bad = next((i for i, lp in enumerate(traj.logprobs) if not math.isfinite(lp)), None)
        if bad is None or traj.infra_fault is not None:
            return traj
        self.stats.nonfinite_refused += 1
        fault = InfraFault("generation_error", f"behaviour logprob {traj.logprobs[bad]} at token {bad}: refused")
        if self.stats.nonfinite_refused <= 10 or self.stats.nonfinite_refused % 1000 == 0:
            log.error(
                "replay queue refused rollout %d of group %s (task %s; %d refused so far): %s",
                traj.rollout_index,
                traj.group_id,
                traj.task_id,
                self.stats.nonfinite_refused,
                fault.message,
            )
        return replace(traj, infra_fault=fault)

    def _completed(self, gid: str, trajs: list[Trajectory]) -> None:
        """A whole group: infra-faulted members out of its statistics, then the filter, then the batch line."""
        faulted = tuple(t for t in trajs if t.infra_fault is not None)
        healthy = [t for t in trajs if t.infra_fault is None]
        if faulted:
            self.stats.infra_failed += len(faulted)
            if len(healthy) < self.min_group_size:
                self.stats.fault_reissued += 1
                staleness = self.policy_version - min(t.policy_version for t in trajs)
                self._faulted.append(Group(gid, healthy, staleness, 0.0, faulted))
                return
            trajs = sorted(healthy + [stand_in(healthy[0], t) for t in faulted], key=lambda t: t.rollout_index)
        if self.filter_groups == "zero_variance" and len({t.reward for t in healthy}) == 1:
            self.stats.filtered += 1
            self._filtered.append(Group(gid, trajs, self.policy_version - _oldest_version(trajs), 0.0, faulted))
        else:
            self._complete[gid] = (trajs, faulted)

    def drain_faulted(self) -> list[Group]:
        """Groups left with fewer than ``min_group_size`` members without an infra fault, since the
        last call: the producer re-issues them (their slot is not done)."""
        out, self._faulted = self._faulted, []
        return out

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
                self.stats.lost_tokens += sum(t.num_generated_tokens for t in pending.rollouts.values())
                out.append((gid, pending.task_id))
        return out

    def abandon(self, group_id: str) -> bool:
        """Give up on a group whose producer died before finishing it: partial
        rollouts are discarded, later deliveries ignored, and True tells the
        caller to re-issue the task under a new group id. False when the group
        had already arrived whole (nothing to re-issue)."""
        if group_id in self._closed:
            return False
        pending = self._pending.pop(group_id, None)
        if pending is not None:
            self.stats.lost_tokens += sum(t.num_generated_tokens for t in pending.rollouts.values())
        self._close(group_id)
        self.stats.abandoned += 1
        return True

    def drain_dropped(self) -> list[Group]:
        """Groups dropped as stale since the last call (for the producer's books)."""
        out, self._dropped = self._dropped, []
        return out

    def ready(self) -> int:
        return len(self._complete)

    def undecided_tokens(self) -> dict[str, int]:
        """Group id -> generated tokens of the rollouts here that no fate has reached yet (incomplete
        groups, complete ones waiting for the learner, ones set aside but not drained): the run's end
        counts them."""
        out = {gid: sum(t.num_generated_tokens for t in p.rollouts.values()) for gid, p in self._pending.items()}
        for gid, (trajs, faulted) in self._complete.items():
            out[gid] = sum(t.num_generated_tokens for t in (*trajs, *faulted))
        for g in (*self._dropped, *self._filtered, *self._faulted):  # decided here, not yet drained by the producer
            out[g.group_id] = sum(t.num_generated_tokens for t in (*g.trajectories, *g.faulted))
        return out

    def take_batch(self, partial: bool = False) -> list[Group] | None:
        """The oldest ``groups_per_batch`` fresh-enough complete groups, or None;
        ``partial``: as many as there are (at least one) when fewer are ready."""
        fresh: list[Group] = []
        for gid in list(self._complete):
            trajs, faulted = self._complete[gid]
            staleness = self.policy_version - _oldest_version(trajs)
            if staleness > self.max_staleness:
                if self.stale_policy == "drop":
                    del self._complete[gid]
                    self.stats.dropped_stale += 1
                    self._dropped.append(Group(gid, trajs, staleness, 0.0, faulted))
                    continue
                weight = 0.5 ** (staleness - self.max_staleness)
            else:
                weight = 1.0
            fresh.append(Group(gid, trajs, staleness, weight, faulted))
            if len(fresh) == self.groups_per_batch:
                break
        if len(fresh) < self.groups_per_batch and not (partial and fresh):
            return None
        for g in fresh:
            del self._complete[g.group_id]
            self.stats.downweighted += g.weight < 1.0
        self.stats.batches += 1
        return fresh
