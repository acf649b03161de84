"""Bookkeeping of the training stream: which task slot is where.

Slot k is the k-th group the run asks for (task ``task_ids[k % len]``). A slot
is dispatched as a GroupJob; if its producer dies, the job is re-issued under
a new group id (same slot); it ends either consumed by the learner (exactly
once, or an error is raised), dropped as stale or filtered out for zero reward
variance (both counted). Admission bounds staleness at the source: with policy
version v acknowledged by the generator, slots up to
(v + max_staleness + 1) * groups_per_step + oversample (plus one for each slot
dropped or filtered: the refill) may start; in sync mode (max_staleness 0,
oversample 0) that is exactly one batch ahead, so generation and learning
alternate.

Pure logic (no Ray, no sockets), so its exactly-once property is tested alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from replay.messages import GroupJob


@dataclass
class SlotCounters:
    dispatched: int = 0  # jobs, re-issues included
    reissued: int = 0
    consumed: int = 0
    dropped: int = 0
    filtered: int = 0


class SlotLedger:
    def __init__(
        self,
        task_ids: list[str],
        n: int,
        groups_per_step: int,
        max_staleness: int,
        seed: int,
        max_attempts: int = 5,
        oversample: int = 0,
    ) -> None:
        if not task_ids:
            raise ValueError("no tasks")
        if oversample < 0:
            raise ValueError(f"oversample must be >= 0 groups, got {oversample}")
        self.oversample = oversample  # extra groups admitted beyond the staleness bound
        self.task_ids = task_ids
        self.n = n
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.seed = seed
        self.max_attempts = max_attempts
        self.next_slot = 0
        self.base = 0  # slots finished before this ledger started (resume)
        self.base_version = 0  # the policy version then
        self.done: set[int] = set()  # consumed slots >= low-water mark
        self.low = 0  # every slot below is consumed or dropped
        self.lost: set[int] = set()  # dropped as stale or filtered (never consumed)
        self.in_flight: dict[str, GroupJob] = {}  # group id -> job
        self.retry: deque[GroupJob] = deque()
        self.errors: dict[int, int] = {}  # slot -> failures not caused by a crash
        self.counters = SlotCounters()

    # ------------------------------------------------------------ dispatch
    def admitted(self, acked_version: int) -> int:
        """Slots that may have started by now."""
        steps = acked_version - self.base_version + self.max_staleness + 1
        return (
            self.base + steps * self.groups_per_step + self.oversample + self.counters.dropped + self.counters.filtered
        )

    def next_job(self, acked_version: int) -> GroupJob | None:
        """A re-issue first, else the next slot if admitted."""
        if self.retry:
            job = self.retry.popleft()
        else:
            while self.next_slot in self.done:  # consumed before a resume
                self.next_slot += 1
            if self.next_slot >= self.admitted(acked_version):
                return None
            slot = self.next_slot
            self.next_slot += 1
            job = self._job(slot, 0)
        self.in_flight[job.group_id] = job
        self.counters.dispatched += 1
        return job

    def _job(self, slot: int, attempt: int) -> GroupJob:
        return GroupJob(
            slot=slot,
            task_id=self.task_ids[slot % len(self.task_ids)],
            group_id=f"g{slot:07d}a{attempt}",
            n=self.n,
            seed=self.seed * 1_000_003 + slot * 7919 + attempt * 104_729,
            attempt=attempt,
        )

    def starts_epoch(self, job: GroupJob) -> bool:
        return job.attempt == 0 and job.slot > 0 and job.slot % len(self.task_ids) == 0

    # ------------------------------------------------------------ outcomes
    def finished(self, group_id: str) -> GroupJob:
        """The producer reported the group sent (it now waits in the replay queue)."""
        return self.in_flight[group_id]

    def failed(self, group_id: str, crash: bool = False) -> GroupJob:
        """The producer failed (``crash``: its process died, which says nothing
        about the task): the slot goes back, under a new group id. A task that
        itself fails ``max_attempts`` times stops the run with its name."""
        job = self.in_flight.pop(group_id)
        if not crash:
            self.errors[job.slot] = self.errors.get(job.slot, 0) + 1
            if self.errors[job.slot] >= self.max_attempts:
                raise RuntimeError(f"task slot {job.slot} ({job.task_id}) failed {self.max_attempts} times; giving up")
        retry = self._job(job.slot, job.attempt + 1)
        self.retry.append(retry)
        self.counters.reissued += 1
        return retry

    def consumed(self, group_id: str) -> int:
        job = self.in_flight.pop(group_id, None)
        if job is None:
            raise RuntimeError(f"group {group_id} reached the learner but was not in flight (duplicate or unknown)")
        if job.slot in self.done:
            raise RuntimeError(f"slot {job.slot} reached the learner twice")
        self.done.add(job.slot)
        self.counters.consumed += 1
        self._advance()
        return job.slot

    def dropped(self, group_id: str) -> int:
        """Too stale when the learner would have taken it: lost, never trained on."""
        return self._set_aside(group_id, "dropped")

    def filtered(self, group_id: str) -> int:
        """The group arrived whole with all rewards equal: set aside, never trained on; the slot is done."""
        return self._set_aside(group_id, "filtered")

    def _set_aside(self, group_id: str, counter: str) -> int:
        job = self.in_flight.pop(group_id)
        self.lost.add(job.slot)
        setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        self._advance()
        return job.slot

    def _advance(self) -> None:
        while self.low in self.done or self.low in self.lost:
            self.done.discard(self.low)
            self.lost.discard(self.low)
            self.low += 1

    # ------------------------------------------------------------ resume
    def state(self) -> dict[str, Any]:
        """Enough to resume: slots below ``low`` are finished; ``done`` lists the
        finished ones above it; every other slot (in flight now) is replayed."""
        return {"low": self.low, "done": sorted(self.done | self.lost), "lost": len(self.lost)}

    def restore(self, state: dict[str, Any], policy_version: int) -> None:
        self.low = self.next_slot = int(state["low"])
        self.done = set(int(s) for s in state["done"])
        self.lost = set()
        # Admission continues from here: the slots finished so far count as the base.
        self.base = self.low + len(self.done)
        self.base_version = policy_version
