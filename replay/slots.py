"""Bookkeeping of the training stream: which task slot is where.

Slot k is the k-th group the run asks for (task ``task_ids[k % len]``). A slot
is dispatched as a GroupJob; if its producer dies, or too many of its episodes
end by an infra fault, the job is re-issued under a new group id (same slot); it
ends either consumed by the learner (exactly once, or an error is raised), dropped
as stale, filtered out for zero reward variance, or given up after
``max_attempts`` failures that were not crashes (one log line names the task and
its first error; the run stops only when more slots were given up than trained). Admission bounds staleness at the source: with policy
version v acknowledged by the generator, slots up to
(v + max_staleness + 1) * groups_per_step + oversample (plus one for each slot
dropped, filtered or given up: the refill) may start; in sync mode (max_staleness 0,
and no oversampling: seal/config.py TrainerConfig) that is exactly one batch
ahead, so generation and learning alternate and every group generated trains.

Pure logic (no Ray, no sockets), so its exactly-once property is tested alone.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay.control_messages import GroupJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotPosition:
    """Where the task stream stands, enough to resume (a checkpoint keeps it as JSON): slots below
    ``low`` are finished, ``done`` lists the finished ones above it; every other slot (in flight at
    the checkpoint) is replayed."""

    low: int
    done: tuple[int, ...]
    lost: int  # of ``done``, the slots given up (accounted for, never trained)

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "done": list(self.done), "lost": self.lost}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SlotPosition:
        # Checkpoints written before ``lost`` was kept have none: it is a count, never read back.
        return cls(int(d["low"]), tuple(int(s) for s in d["done"]), int(d.get("lost", 0)))


@dataclass
class SlotCounters:
    dispatched: int = 0  # jobs, re-issues included
    reissued: int = 0
    consumed: int = 0
    dropped: int = 0
    filtered: int = 0
    given_up: int = 0  # slots whose task failed max_attempts times for reasons other than a crash


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
        episode_deadline_s: float | None = None,
        episode_version: str = "latest",
        reference_logprobs: str = "learner",
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
        self.episode_deadline_s = episode_deadline_s  # travels with every job (GroupJob.episode_deadline_s)
        self.episode_version = episode_version  # travels with every job (GroupJob.episode_version)
        self.reference_logprobs = reference_logprobs  # and so does this (GroupJob.reference_logprobs)
        self.next_slot = 0
        self.base = 0  # slots finished before this ledger started (resume)
        self.base_version = 0  # the policy version then
        self.done: set[int] = set()  # consumed slots >= low-water mark
        self.low = 0  # every slot below is consumed or dropped
        self.lost: set[int] = set()  # dropped as stale or filtered (never consumed)
        self.in_flight: dict[str, GroupJob] = {}  # group id -> job
        self.retry: deque[GroupJob] = deque()
        self.errors: dict[int, int] = {}  # slot -> failures not caused by a crash
        self.first_error: dict[int, str] = {}  # slot -> the first of them, for the give-up line
        self.counters = SlotCounters()

    # ------------------------------------------------------------ dispatch
    def admitted(self, acked_version: int) -> int:
        """Slots that may have started by now."""
        steps = acked_version - self.base_version + self.max_staleness + 1
        c = self.counters
        return self.base + steps * self.groups_per_step + self.oversample + c.dropped + c.filtered + c.given_up

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
            episode_deadline_s=self.episode_deadline_s,
            episode_version=self.episode_version,
            reference_logprobs=self.reference_logprobs,
        )

    def starts_epoch(self, job: GroupJob) -> bool:
        return job.attempt == 0 and job.slot > 0 and job.slot % len(self.task_ids) == 0

    # ------------------------------------------------------------ outcomes
    def finished(self, group_id: str) -> GroupJob:
        """The producer reported the group sent (it now waits in the replay queue)."""
        return self.in_flight[group_id]

    def failed(self, group_id: str, crash: bool = False, error: str = "") -> GroupJob | None:
        """The producer failed (``crash``: its process died, which says nothing
        about the task) or the group's episodes ended by infra faults (``error``:
        the first): the slot goes back, under a new group id. A slot that fails
        ``max_attempts`` times otherwise than by a crash is given up (None; one log
        line); more slots given up than trained stops the run (the system, not a
        task, is failing)."""
        job = self.in_flight.pop(group_id)
        if not crash:
            self.errors[job.slot] = self.errors.get(job.slot, 0) + 1
            self.first_error.setdefault(job.slot, error or "no error text")
            if self.errors[job.slot] >= self.max_attempts:
                self._give_up(job)
                return None
        retry = self._job(job.slot, job.attempt + 1)
        self.retry.append(retry)
        self.counters.reissued += 1
        return retry

    def _give_up(self, job: GroupJob) -> None:
        self.lost.add(job.slot)
        self.counters.given_up += 1
        first = self.first_error.pop(job.slot, "")
        self.errors.pop(job.slot, None)
        self._advance()
        log.warning(
            "task %s (slot %d) given up after %d attempts failed for the system's reasons; first error: %s",
            job.task_id,
            job.slot,
            self.max_attempts,
            first,
        )
        if self.counters.given_up > self.counters.consumed + self.max_attempts:
            raise RuntimeError(
                f"{self.counters.given_up} task slots given up against {self.counters.consumed} trained: "
                f"the system keeps failing (last: {job.task_id}: {first}); see the run log"
            )

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
    def state(self) -> SlotPosition:
        return SlotPosition(self.low, tuple(sorted(self.done | self.lost)), len(self.lost))

    def restore(self, position: SlotPosition, policy_version: int) -> None:
        self.low = self.next_slot = position.low
        self.done = set(position.done)
        self.lost = set()
        # Admission continues from here: the slots finished so far count as the base.
        self.base = self.low + len(self.done)
        self.base_version = policy_version
