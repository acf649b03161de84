"""Rollout groups to env actors: each idle env actor gets the ledger's next job, routed to
one generator replica (its prefix cache serves every turn and rollout of the group), and
the job's report, or its failure, comes back here. The trajectories themselves travel to
the replay server on their own stream (replay/transport.py); the report only counts them.

A group whose episodes the system ended (infra faults) with too few members left to train
(trainer.min_group_size; replay/queue.py) is re-issued here through the slot ledger, like a
group lost with a crashed actor; a task that keeps failing that way is given up (replay/slots.py).
A step's generation figures describe the groups the step decided, so before its row the step
waits (bounded) for those groups' reports: ``settle``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from env_pool.contract import EnvContractError
from replay.control_messages import LOST_TOKENS_ATTR, GroupJob, GroupReport
from rollout.generator import GeneratorUnavailable

if TYPE_CHECKING:
    from replay.slots import SlotLedger
    from replay.transport import ReplayServer
    from seal.run.progress import Progress
    from seal.run.step_metrics import StepWindow
    from seal.runtime.actor_set import ActorSet
    from seal.runtime.publisher import WeightPublisher

log = logging.getLogger(__name__)


def contract_broken(exc: BaseException) -> Exception | None:
    """The env's contract error behind a failed group (env_pool/contract.py), as one line naming the
    env, the method and the value, or None. It stops the run at once: it is no infra fault."""
    cause = getattr(exc, "cause", None)
    for candidate in (cause, exc):
        if isinstance(candidate, EnvContractError):
            text = str(candidate.args[0] if candidate.args else candidate).splitlines()[0]
            return EnvContractError(f"{text}; the run stops: a verdict the contract refuses is the env's to fix")
    return None


# A decided group's report is at most a moment behind its trajectories (the env actor returns it
# once they are handed to the transport): a minute means the actor is gone.
SETTLE_TIMEOUT_S = 60.0
# At the run's end the groups still playing are waited for this long, so their tokens are counted
# (in_flight_end) instead of left with the actors; past it they count as unattributed.
END_DRAIN_TIMEOUT_S = 300.0


class Dispatcher:
    def __init__(
        self,
        actors: ActorSet,
        ledger: SlotLedger,
        replay: ReplayServer,
        publisher: WeightPublisher,
        window: StepWindow,
        progress: Progress,
        max_new_tokens: int,
        filter_zero_variance: bool,
    ) -> None:
        self.actors, self.ledger, self.replay, self.publisher = actors, ledger, replay, publisher
        self.window, self.progress = window, progress
        self.max_new_tokens, self.filter_zero_variance = max_new_tokens, filter_zero_variance
        self.jobs: dict[Any, tuple[GroupJob, str]] = {}  # job ref -> (job, env actor name)
        self.given_up: set[str] = set()  # group ids failed here: a late report of one is not the group's

    def fill(self) -> None:
        """A job for every idle env actor, while the ledger admits one at the acknowledged version."""
        fleet = self.actors.generators
        if fleet.all_down():  # groups would only fail until a replica is back
            return
        while True:
            actor = self.actors.idle_env_actor(busy={name for _, name in self.jobs.values()})
            if actor is None:
                return
            job = self.ledger.next_job(self.publisher.acked)
            if job is None:
                return
            if self.ledger.starts_epoch(job):
                self.actors.coordinator.end_epoch.remote()
            name, handle = actor
            # The router fixes the group's replica; the load it balances is the group's token budget.
            budget = job.n * (self.max_new_tokens + 1)
            job = dataclasses.replace(job, generator=fleet.router.route(job.group_id, budget))
            self.jobs[handle.run_group.remote(job)] = (job, name)
            self.progress.group_started(job, name, self.publisher.acked)

    def refs(self) -> list:
        return list(self.jobs)

    def collect(self, ready: list) -> None:
        for ref in ready:
            if ref in self.jobs:
                self._done(ref)

    def expire(self) -> None:
        """Groups whose rollouts did not all arrive in time are given up, and groups left with too few
        members by infra faults; their slots re-issued (or, after the ledger's bound, given up)."""
        for gid, _task in self.replay.expired():
            if gid in self.ledger.in_flight:
                self.given_up.add(gid)
                self.ledger.failed(gid, error=f"group {gid} past trainer.reissue_after_s")
        for group in self.replay.drain_faulted():
            self.window.decide("infra_failed", group)
            if group.group_id in self.ledger.in_flight:
                self.given_up.add(group.group_id)
                self.ledger.failed(group.group_id, error=str(group.faulted[0].infra_fault))

    def settle(self, group_ids: Iterable[str], timeout_s: float = SETTLE_TIMEOUT_S, warn: bool = True) -> list[str]:
        """Wait (at most ``timeout_s``) for the jobs of ``group_ids`` to come back, and take their
        reports; returns the group ids still out (``warn``: named in a log line)."""
        import ray

        wanted = set(group_ids)
        refs = [ref for ref, (job, _) in self.jobs.items() if job.group_id in wanted]
        deadline = time.monotonic() + timeout_s
        while refs and (left := deadline - time.monotonic()) > 0:
            ready, refs = ray.wait(refs, num_returns=len(refs), timeout=left)
            self.collect(ready)
        out = [job.group_id for ref, (job, _) in self.jobs.items() if ref in refs]
        if out and warn:
            log.warning(
                "no report in %.0f s from the env actors of %d groups this step decided (%s): the step's "
                "generation figures leave them out",
                timeout_s,
                len(out),
                ", ".join(out),
            )
        return out

    def drain(self, timeout_s: float = END_DRAIN_TIMEOUT_S) -> list[str]:
        """The run's end: every job in flight comes back (bounded), none starts; the group ids still out."""
        out = self.settle([job.group_id for job, _ in self.jobs.values()], timeout_s, warn=False)
        if out:
            log.warning(
                "the run ends with %d groups still playing after %.0f s (%s): their tokens count as unattributed",
                len(out),
                timeout_s,
                ", ".join(out),
            )
        return out

    def _done(self, ref: Any) -> None:  # a finished run_group's ObjectRef
        import ray

        job, name = self.jobs.pop(ref)
        self.actors.generators.router.release(job.group_id)
        try:
            report: GroupReport = ray.get(ref)
        except (ray.exceptions.RayActorError, GeneratorUnavailable, ray.exceptions.RayTaskError) as exc:
            broken = contract_broken(exc)
            if broken is not None:  # the env's own bug: every retry would break it again
                raise broken from None
            # A crash (kill -9, node loss, a dead generator: Ray restarts it)
            # says nothing about the task; any other task error counts toward
            # the slot's bounded retries. Either way the group is given up and
            # its slot re-issued.
            crash = isinstance(exc, (ray.exceptions.RayActorError, GeneratorUnavailable))
            log.warning(
                "group %s (slot %d, task %s) lost on %s: %s",
                job.group_id,
                job.slot,
                job.task_id,
                name,
                exc.__class__.__name__ if crash else exc,
            )
            self.window.note_failure(exc)
            # What the group generated before it failed (a crashed env actor takes it along: unattributed).
            cause = getattr(exc, "cause", None)
            self.window.tokens.add("lost", int(getattr(cause if cause is not None else exc, LOST_TOKENS_ATTR, 0)))
            if job.group_id in self.ledger.in_flight and self.replay.abandon(job.group_id):
                self.given_up.add(job.group_id)
                self.ledger.failed(job.group_id, crash=crash, error=f"{exc.__class__.__name__}: {exc}")
            if isinstance(exc, ray.exceptions.RayActorError):
                self.actors.crashed(name)
            if isinstance(exc, GeneratorUnavailable):
                self.actors.generators.replica_lost(job.generator)
                self.publisher.check(force=True)
            return
        if job.group_id not in self.given_up:  # its fate may already be decided: the report still describes it
            self.window.add_report(report)
            played = [r for r, fault in zip(report.rewards, report.faults or [""] * len(report.rewards)) if not fault]
            equal = self.filter_zero_variance and len(set(played)) == 1
            self.progress.group_done(report, filtered=equal, in_flight=len(self.jobs))
