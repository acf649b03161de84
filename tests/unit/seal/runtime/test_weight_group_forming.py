"""Forming the weight group while learner rank 0 is busy (issue 38 item 6; seal/runtime/publisher.py).

Rank 0's join is an ordered call: it runs after the call before it (a training step, up to
``learner.step_timeout_s``). The replicas' joins wait for rank 0 on a clock of their own, so they
must not start before rank 0's turn. Here: the real publisher, learner group calls, call order,
fleet join and weight group (gloo); rank 0 is an actor held in an ordered call twice as long as
the replicas' join bound, which is set low (on GPU vLLM's NCCL engine waited a fixed 300 s).
"""

from __future__ import annotations

import sys
import time

import pytest

from learner.config import LearnerConfig
from seal.config import LearnerGroupConfig
from seal.runtime.generator_fleet import GeneratorFleet
from seal.runtime.learner_group import LearnerGroup
from seal.runtime.publisher import WeightPublisher
from tests.conftest import local_ray

pytestmark = pytest.mark.timeout(300)

REPLICA_JOIN_S = 5.0  # the replicas' bound on their join, whatever the driver asks
HOLD_S = 10.0  # rank 0's call before its join (a training step)
RANK0_TIMEOUT_S = 30.0  # learner.timeout_s


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=1, object_store_bytes=80 * 2**20):
        yield


class Rank:
    """Learner rank 0 as far as the weight group goes: its real call order and broadcaster."""

    def __init__(self) -> None:
        from learner.call_order import CallOrder

        self.order = CallOrder("learner rank 0")
        self.broadcaster = None

    def hold(self, ticket: int, seconds: float) -> None:
        with self.order.turn(ticket, "train step", 60.0):
            time.sleep(seconds)

    def next_ticket(self) -> int:
        return self.order.next_ticket

    def weight_group_address(self) -> tuple[str, int]:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return "127.0.0.1", sock.getsockname()[1]

    def join_weight_group(self, ticket: int, host: str, port: int, world: int, backend: str, dtype=None) -> list:
        from learner.weight_broadcast import WeightBroadcaster

        with self.order.turn(ticket, "weight group", 60.0):
            self.broadcaster = WeightBroadcaster(host, port, world, backend, timeout_s=RANK0_TIMEOUT_S)
            return ["layout"]


class Replica:
    def dtype(self) -> str:
        return "float32"

    def join_weight_group(self, host: str, port: int, world: int, backend: str, rank: int, timeout_s=600.0):
        from weights.broadcast_group import WeightGroup

        self.group = WeightGroup(host, port, rank, world, backend, "cpu", REPLICA_JOIN_S)
        return [rank]


class Fleet:
    """Two replicas of one worker each; the join is GeneratorFleet's own."""

    tp = 1
    canary_ids = None
    join_weight_group = GeneratorFleet.join_weight_group

    def __init__(self) -> None:
        import ray

        self.names = ["r0", "r1"]
        self.handles = {n: ray.remote(Replica).options(num_cpus=0).remote() for n in self.names}
        self.first = self.handles["r0"]

    def weight_group_size(self) -> int:
        return 1 + len(self.names) * self.tp


def learner_group(rank) -> LearnerGroup:
    """LearnerGroup's own calls over one rank actor (its constructor would start DeepSpeed)."""
    g = object.__new__(LearnerGroup)
    g.settings = LearnerGroupConfig(
        model_path="tiny",
        group_size=2,
        world_size=1,
        timeout_s=RANK0_TIMEOUT_S,
        step_timeout_s=60.0,
        cfg=LearnerConfig(),
    )
    g.io = None
    g.actors, g.nodes, g.step = [rank], [{"ip": "127.0.0.1", "host": "test"}], 0
    g._tickets, g._pending, g.survivable_failures, g._weight_join_ticket = [0], [], [], 0
    return g


def test_the_group_forms_while_rank_0_finishes_a_call_longer_than_the_replicas_join_bound():
    """Before: the replicas joined at once, timed out after REPLICA_JOIN_S while rank 0 was still
    in its step, and rank 0 then waited for members that had given up."""
    import ray

    rank = ray.remote(Rank).options(num_cpus=0, max_concurrency=4).remote()
    learners, fleet = learner_group(rank), Fleet()
    publisher = WeightPublisher(fleet, learners, 0, True, "gloo", None, 1.0)
    learners._submit(0, "hold", HOLD_S)  # a training step on rank 0, not waited for
    publisher.form_group()
    assert publisher.group_meta == ["layout"]
    assert ray.get(rank.next_ticket.remote()) == 2  # the step, then the join, both ended
