"""EnvActor (actors/env_actor.py) with fakes only at its edges (a coordinator and a generator replica,
each a small Ray actor) and the real replay server: a group's trajectories reach the stream whole and
the report counts them, an interface pushed between groups is the next group's (an older push never
wins), and a job routed to a replica that is gone fails so the driver re-issues it (with what the group
had generated, for the token books)."""

from __future__ import annotations

import sys
import time

import pytest

from env_pool.interface.state import InterfaceState
from env_pool.toy.env import ToyToolEnv
from replay.control_messages import LOST_TOKENS_ATTR, GroupJob, InterfaceStateMessage, InterfaceUpdate
from replay.queue import ReplayQueue
from replay.transport import ReplayServer, TransportConfig
from rollout.generator import GenerationOutput, GeneratorUnavailable, SamplingConfig
from tests.conftest import local_ray


def message(state: InterfaceState) -> InterfaceStateMessage:
    return InterfaceStateMessage.from_dict(state.to_dict())


pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    # The fakes below travel to their workers by value: this module is not importable there.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2, object_store_bytes=80 * 2**20):
        yield


class FakeCoordinator:
    def __init__(self, version: int) -> None:
        self.version = version

    def interface(self) -> InterfaceUpdate:
        return InterfaceUpdate(self.version, message(InterfaceState(version=self.version)))


class FakeReplica:
    """Answers every request with ``reply`` (token ids ending with EOS) under weights version 7."""

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply

    def max_model_len(self) -> int:
        return 4096

    def policy_version(self) -> int:
        return 7

    def generate(self, requests, sampling) -> list[GenerationOutput]:
        return [
            GenerationOutput(r.request_id, self.reply, [-1.0] * len(self.reply), "stop", 7, len(r.prompt_ids), 0)
            for r in requests
        ]


@pytest.fixture(scope="module")
def actor(ray_session):
    import ray

    from actors.env_actor import EnvActor
    from rollout.chat import ChatTokenizer
    from weights.model_assets import load_tokenizer

    chat = ChatTokenizer(load_tokenizer("tiny"))
    reply = chat.encode("I do not know.") + [chat.eos_id]
    coordinator = ray.remote(FakeCoordinator).options(name="test-coordinator").remote(3)
    replica = ray.remote(FakeReplica).options(name="test-replica").remote(reply)
    server = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(max_ready_groups=8)
    )
    env_actor = EnvActor(
        "env-0",
        ToyToolEnv,
        lambda: load_tokenizer("tiny"),
        "test-replica",
        "test-coordinator",
        server.address,
        SamplingConfig(max_new_tokens=16),
        hwm=8,
        send_timeout_s=30.0,
        keys=server.client_keys,
    )
    yield env_actor, server
    env_actor.close()
    server.close()
    del coordinator, replica


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def job(slot: int, **kw) -> GroupJob:
    return GroupJob(slot=slot, task_id="toy_4", group_id=f"g{slot}", n=2, seed=slot, **kw)


def test_a_group_reaches_the_stream_whole_and_the_report_counts_it(actor):
    env_actor, server = actor
    assert env_actor.interface.version == 3  # read from the coordinator at start
    report = env_actor.run_group(job(0))
    assert (report.slot, report.group_id, report.sent, report.rewards) == (0, "g0", 2, (0.0, 0.0))
    assert report.interface_version == 3 and report.start_version == 7 and report.generation.generated_tokens > 0
    assert wait_for(lambda: server.ready() == 1)
    (group,) = server.take_batch()
    assert [t.rollout_index for t in group.trajectories] == [0, 1]
    assert {(t.group_id, t.interface_version, t.policy_version) for t in group.trajectories} == {("g0", 3, 7)}


def test_an_interface_pushed_between_groups_is_the_next_groups(actor):
    env_actor, server = actor
    newer = InterfaceState(version=5, schema_lite=True)
    assert env_actor.set_interface(InterfaceUpdate(5, message(newer))) == 5
    assert env_actor.set_interface(InterfaceUpdate(4, message(InterfaceState(version=4)))) == 5  # pushes may cross
    report = env_actor.run_group(job(1))
    assert report.interface_version == 5
    assert wait_for(lambda: server.ready() == 1)
    (group,) = server.take_batch()
    assert {t.interface_version for t in group.trajectories} == {5}


def test_a_job_for_a_replica_that_is_gone_fails_for_the_driver_to_reissue(actor):
    env_actor, _ = actor
    with pytest.raises(GeneratorUnavailable, match="generator replica retired-replica is not running"):
        env_actor.run_group(job(2, generator="retired-replica"))


class DyingReplica(FakeReplica):
    """Answers the first call, then its process dies (a crashed replica)."""

    calls = 0

    def generate(self, requests, sampling) -> list[GenerationOutput]:
        self.calls += 1
        if self.calls > 1:
            import os

            os._exit(1)
        return super().generate(requests, sampling)


def test_a_group_whose_replica_dies_fails_with_what_it_had_generated(actor):
    import ray

    from rollout.chat import ChatTokenizer
    from weights.model_assets import load_tokenizer

    env_actor, _ = actor
    chat = ChatTokenizer(load_tokenizer("tiny"))
    tool_call = chat.encode(ToyToolEnv().reference_turns("toy_4")[0][0]) + [chat.eos_id]  # the episode goes on
    replica = ray.remote(DyingReplica).options(name="test-dying-replica").remote(tool_call)
    with pytest.raises(GeneratorUnavailable) as failed:
        env_actor.run_group(job(3, generator="test-dying-replica"))
    # Nothing of the group was sent: the driver's token books count these lost (seal/run/dispatch.py).
    assert getattr(failed.value, LOST_TOKENS_ATTR) == 2 * len(tool_call)
    del replica
