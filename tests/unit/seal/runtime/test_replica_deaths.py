"""A replica Ray gave up on ends the run in one line; one Ray is restarting does not.

The rule rests on what Ray answers a probe in each state, so the last test holds a real Ray
actor to it: a Ray upgrade that changes the answers fails here, not in a run that waits for ever.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from seal.runtime.replica_deaths import DEAD_PROBES, ReplicaDeaths, ReplicaGone
from tests.conftest import local_ray

pytestmark = pytest.mark.timeout(300)


def test_dead_probes_in_a_row_end_the_run_with_the_replica_and_node_named():
    deaths = ReplicaDeaths(max_restarts=3)
    for _ in range(DEAD_PROBES - 1):
        deaths.failed("run-generator-0", died=True, node="n1")
    with pytest.raises(ReplicaGone, match=r"run-generator-0 on node n1 is dead for good.*max_restarts=3"):
        deaths.failed("run-generator-0", died=True, node="n1")


def test_an_answer_or_a_restarting_reply_starts_the_count_again():
    deaths = ReplicaDeaths(max_restarts=1)
    for reset in (lambda: deaths.answered("g"), lambda: deaths.failed("g", died=False)):
        for _ in range(DEAD_PROBES - 1):
            deaths.failed("g", died=True)
        reset()
        for _ in range(DEAD_PROBES - 1):
            deaths.failed("g", died=True)  # the count began afresh: still no verdict
        deaths.answered("g")
    deaths.failed("other", died=True)  # replicas are counted apart
    for _ in range(DEAD_PROBES - 1):
        deaths.failed("g", died=True)


class SlowStart:
    def __init__(self) -> None:
        time.sleep(2)  # a replica's engine takes a while to start: probes meet it restarting

    def pid(self) -> int:
        return os.getpid()


def _probe(handle, deaths: ReplicaDeaths) -> str:
    import ray

    try:
        ray.get(handle.pid.remote(), timeout=60)
    except ray.exceptions.RayActorError as exc:
        deaths.failed("r", isinstance(exc, ray.exceptions.ActorDiedError))
        return type(exc).__name__
    deaths.answered("r")
    return "answered"


def test_ray_answers_a_restarting_actor_unavailable_and_a_spent_one_dead():
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=1, object_store_bytes=80 * 2**20):
        handle = ray.remote(SlowStart).options(max_restarts=1, max_task_retries=0).remote()
        deaths = ReplicaDeaths(max_restarts=1)
        os.kill(ray.get(handle.pid.remote(), timeout=60), signal.SIGKILL)
        seen = []
        deadline = time.monotonic() + 60
        while "answered" not in seen and time.monotonic() < deadline:
            seen.append(_probe(handle, deaths))  # raises ReplicaGone if a restart read as the end
            time.sleep(0.2)
        assert seen[-1] == "answered" and "ActorUnavailableError" in seen, seen
        os.kill(ray.get(handle.pid.remote(), timeout=60), signal.SIGKILL)  # its one restart is spent
        with pytest.raises(ReplicaGone):
            for _ in range(DEAD_PROBES):
                _probe(handle, deaths)
