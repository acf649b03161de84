"""Dispatcher (seal/run/dispatch.py) with fakes only at its edges (env actors as small Ray actors, the
actor set, the fleet's up/down state, the publisher's acknowledged version) and the real slot ledger,
replay server, router and step window: every idle env actor gets a job the ledger admits, routed to a
replica; a report comes back to the step's books; a task error, a crashed actor and a lost replica each
re-issue the slot under a new group id (only the task error counts toward its retries), the crashed actor
gets no job until it answers, the lost replica is reported and the weights checked; a verdict the env
contract refuses stops the run instead (the env's bug: a retry breaks it again)."""

from __future__ import annotations

import os
import sys

import pytest

from replay.control_messages import GroupReport, GroupStats
from replay.queue import ReplayQueue
from replay.slots import SlotLedger
from replay.transport import ReplayServer, TransportConfig
from rollout.generator import GeneratorUnavailable
from seal.run.dispatch import Dispatcher
from seal.run.progress import Progress
from seal.run.step_metrics import StepWindow
from seal.runtime.router import ReplicaRouter
from tests.conftest import local_ray

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fakes travel by value
    with local_ray(num_cpus=2, object_store_bytes=80 * 2**20):
        yield


class FakeEnvActor:
    """Plays nothing: answers a report, or fails the way it was told to."""

    def __init__(self, name: str, fails: str = "") -> None:
        self.name, self.fails = name, fails

    def run_group(self, job) -> GroupReport:
        if self.fails == "task":
            raise ValueError(f"task {job.task_id} broke the env")
        if self.fails == "contract":
            from env_pool.contract import EnvContractError

            raise EnvContractError("env my_env.MyEnv.judge: reward 2.0 is not a number in [0, 1] (docs/x.md)")
        if self.fails == "crash":
            os._exit(1)
        if self.fails == "replica":
            raise GeneratorUnavailable(f"generator replica {job.generator} is not running")
        return GroupReport(
            slot=job.slot,
            group_id=job.group_id,
            task_id=job.task_id,
            actor=self.name,
            sent=job.n,
            interface_version=0,
            start_version=0,
            generation=GroupStats(prompt_tokens=10, generated_tokens=8, generate_s=0.1),
            env_s=0.1,
            send_s=0.0,
            wall_s=0.2,
            env_steps=2,
            tool_calls=1,
            rewards=(1.0, 0.0),
        )

    def pid(self) -> int:
        return os.getpid()


class FakeCoordinator:
    def __init__(self) -> None:
        self.epochs = 0

    def end_epoch(self) -> None:
        self.epochs += 1

    def epochs_ended(self) -> int:
        return self.epochs


class FakeFleet:
    def __init__(self) -> None:
        self.router = ReplicaRouter(["r0", "r1"])
        self.down = False
        self.lost: list[str] = []

    def all_down(self) -> bool:
        return self.down

    def replica_lost(self, name: str) -> None:
        self.lost.append(name)


class FakeActors:
    """The actor set as the dispatcher sees it: env actors by name, the fleet, the coordinator."""

    def __init__(self, fails: dict[str, str]) -> None:
        import ray

        self.env = {name: ray.remote(FakeEnvActor).remote(name, how) for name, how in fails.items()}
        self.generators = FakeFleet()
        self.coordinator = ray.remote(FakeCoordinator).remote()
        self.crashes: list[str] = []

    def idle_env_actor(self, busy: set[str]):
        return next(((n, h) for n, h in self.env.items() if n not in busy and n not in self.crashes), None)

    def crashed(self, name: str) -> None:
        self.crashes.append(name)


class FakePublisher:
    acked = 0

    def __init__(self) -> None:
        self.checks: list[bool] = []

    def check(self, force: bool = False) -> None:
        self.checks.append(force)


def dispatcher(fails: dict[str, str], tasks=("t0", "t1", "t2", "t3"), groups_per_step: int = 2):
    ledger = SlotLedger(list(tasks), n=2, groups_per_step=groups_per_step, max_staleness=1, seed=0)
    replay = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=groups_per_step, reissue_after_s=900.0), TransportConfig()
    )
    window = StepWindow("async", max_new_tokens=16, learner_world_size=1, generator_replicas=2, skipped_overlong=0)
    d = Dispatcher(FakeActors(fails), ledger, replay, FakePublisher(), window, Progress(quiet=True), 16, False)
    return d, replay


def settle(d: Dispatcher) -> None:
    import ray

    ready, _ = ray.wait(d.refs(), num_returns=len(d.refs()), timeout=60)
    assert len(ready) == len(d.refs()), "a fake env actor did not answer"
    d.collect(ready)


def test_every_idle_actor_gets_an_admitted_job_routed_to_a_replica_and_reports_come_back():
    d, replay = dispatcher({"env-0": "", "env-1": "", "env-2": ""}, groups_per_step=1)
    try:
        d.fill()
        jobs = sorted((job for job, _ in d.jobs.values()), key=lambda j: j.slot)
        # Policy version 0 acknowledged, staleness 1, one group a step: two slots admitted, so one actor waits.
        assert [j.slot for j in jobs] == [0, 1] and {name for _, name in d.jobs.values()} == {"env-0", "env-1"}
        assert sorted(j.generator for j in jobs) == ["r0", "r1"]  # least-loaded: one group each
        settle(d)
        assert set(d.window.reports) == {j.group_id for j in jobs}
        assert set(d.ledger.in_flight) == {j.group_id for j in jobs}  # sent: they wait for the learner now
        assert not d.jobs
    finally:
        replay.close()


def test_nothing_is_dispatched_while_every_replica_is_down():
    d, replay = dispatcher({"env-0": ""})
    try:
        d.actors.generators.down = True
        d.fill()
        assert not d.jobs and d.ledger.counters.dispatched == 0
    finally:
        replay.close()


@pytest.mark.parametrize("fails, counts_as_error", [("task", True), ("crash", False), ("replica", False)])
def test_a_failed_group_is_reissued_under_a_new_id_of_the_same_slot(fails, counts_as_error):
    d, replay = dispatcher({"env-0": fails}, groups_per_step=1)
    try:
        d.fill()
        ((first, _),) = d.jobs.values()
        settle(d)
        assert first.group_id not in d.ledger.in_flight and d.ledger.counters.reissued == 1
        assert d.ledger.errors.get(first.slot, 0) == (1 if counts_as_error else 0)  # a crash says nothing of the task
        assert d.window.failures and not d.window.reports
        assert d.actors.crashes == (["env-0"] if fails == "crash" else [])  # no job until it answers again
        assert d.actors.generators.lost == ([first.generator] if fails == "replica" else [])
        assert d.publisher.checks == ([True] if fails == "replica" else [])
        again = d.ledger.next_job(0)
        assert (again.slot, again.attempt, again.task_id) == (first.slot, 1, first.task_id)
        assert again.group_id != first.group_id
    finally:
        replay.close()


def test_a_job_that_starts_a_pass_over_the_tasks_ends_the_coordinators_epoch():
    import ray

    d, replay = dispatcher({"env-0": "", "env-1": "", "env-2": ""}, tasks=("t0", "t1"), groups_per_step=2)
    try:
        d.fill()  # slots 0, 1, 2 of two tasks: slot 2 starts the second epoch
        assert sorted(job.slot for job, _ in d.jobs.values()) == [0, 1, 2]
        assert ray.get(d.actors.coordinator.epochs_ended.remote(), timeout=30) == 1
        settle(d)
    finally:
        replay.close()


def test_a_verdict_the_contract_refuses_stops_the_run_in_one_line_and_is_never_retried():
    from env_pool.contract import EnvContractError

    d, replay = dispatcher({"env-0": "contract"}, groups_per_step=1)
    try:
        d.fill()
        with pytest.raises(EnvContractError) as exc:
            settle(d)
        assert str(exc.value) == (
            "env my_env.MyEnv.judge: reward 2.0 is not a number in [0, 1] (docs/x.md); "
            "the run stops: a verdict the contract refuses is the env's to fix"
        )
        assert d.ledger.counters.reissued == 0 and not d.ledger.errors
    finally:
        replay.close()
