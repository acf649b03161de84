"""LearnerSteps (seal/run/learner_steps.py) with fakes only at its edges (a learner group that trains
nothing, a publisher that records) and the real replay server, slot ledger, step window, run state and
coordinator service: a ready batch goes to the learner with its trajectories and the coordinator's tag
weights, its end is a new policy version published and a closed round; when the filter keeps emptying
the batch the step is skipped (no update, no new version, nothing published, the round still closes)
or, with trainer.unfilled=partial, trains on what is ready."""

from __future__ import annotations

import sys
import time

import pytest

from actors.coordinator.coordinator import Coordinator
from actors.coordinator.tag_weights import TagWeights
from env_pool.interface.state import InterfaceState
from learner.step_result import LearnerStepResult
from replay.messages import Segment, Trajectory
from replay.queue import ReplayQueue
from replay.slots import SlotLedger
from replay.transport import ReplayServer, TrajectorySender, TransportConfig
from seal.config import TrainerConfig, compose
from seal.run.learner_steps import LearnerSteps
from seal.run.progress import Progress
from seal.run.run_state import RunState
from seal.run.step_metrics import StepWindow
from tests.conftest import local_ray
from tests.unit.learner.step_results import step_result

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def coordinator():
    import ray

    from actors.coordinator.service import CoordinatorService

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2, object_store_bytes=80 * 2**20):
        yield ray.remote(CoordinatorService).remote(make_coordinator)


def make_coordinator() -> Coordinator:
    return Coordinator(InterfaceState(guidelines=True), TagWeights())


class FakeCall:
    refs: list = []


class FakeLearnerGroup:
    """Trains nothing: records each call and answers the step's result at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict, int, bool]] = []

    def train(self, trajs, weights_ref, group_weights, version, partial):
        import ray

        self.calls.append((trajs, ray.get(weights_ref, timeout=60), version, partial))
        return FakeCall()

    def done(self, call) -> bool:
        return True

    def result(self, call) -> LearnerStepResult:
        return step_result(sequence_tokens=sum(len(t.token_ids) for t in self.calls[-1][0]), loss=0.1)


class FakePublisher:
    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, version: int) -> list:
        self.published.append(version)
        return []

    def wait(self, refs) -> None:
        pass


class Actors:
    def __init__(self, coordinator) -> None:
        self.coordinator, self.learners = coordinator, FakeLearnerGroup()


def trajectory(group_id: str, index: int, reward: float) -> Trajectory:
    return Trajectory(
        task_id="toy_4",
        category="multiply",
        env="toy",
        group_id=group_id,
        rollout_index=index,
        interface_version=0,
        token_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -0.5],
        prompt_length=2,
        segments=[Segment(2, 4, 0)],
        reward=reward,
        success=bool(reward),
        progress=reward,
        tags=["pass" if reward else "empty_turn_model_response"],
        labels=["pass" if reward else "missing_tool_call"],
        error_type=None,
        outcome="completed",
        num_tool_calls=1,
        num_steps=1,
        timings={"total_s": 0.1},
    )


@pytest.fixture
def steps(tmp_path, coordinator):
    def build(**trainer):
        values = {**TrainerConfig.of(compose([])).__dict__, "groups_per_step": 1, "fill_patience": 2, **trainer}
        t = TrainerConfig(**values)
        ledger = SlotLedger(["toy_4"], n=2, groups_per_step=t.groups_per_step, max_staleness=1, seed=0, oversample=8)
        replay = ReplayServer(
            ReplayQueue(2, t.groups_per_step, filter_groups="zero_variance", reissue_after_s=900.0), TransportConfig()
        )
        actors = Actors(coordinator)
        state = RunState(tmp_path, tmp_path, actors, Progress(quiet=True), "tiny", 2, None)
        window = StepWindow(t.mode, 16, 1, 1, 0)
        s = LearnerSteps(
            t, state, actors, replay, ledger, FakePublisher(), window, Progress(quiet=True), 1, "recompute"
        )
        built.append((s, TrajectorySender(replay.address, keys=replay.client_keys, send_timeout_s=600.0, hwm=64)))
        return s, built[-1][1]

    built: list = []
    yield build
    for s, sender in built:
        sender.close()
        s.replay.close()


def deliver(s: LearnerSteps, sender: TrajectorySender, rewards: tuple[float, float]) -> str:
    job = s.ledger.next_job(0)
    before = s.replay.counters().queue.accepted
    for i, reward in enumerate(rewards):
        sender.send(trajectory(job.group_id, i, reward))
    deadline = time.time() + 30
    while s.replay.counters().queue.accepted < before + 2 and time.time() < deadline:
        time.sleep(0.02)
    return job.group_id


def test_a_ready_batch_trains_and_its_end_is_a_published_version_and_a_closed_round(steps):
    s, sender = steps()
    assert s.advance() is None and not s.actors.learners.calls  # nothing ready
    gid = deliver(s, sender, (1.0, 0.0))
    outcome = s.advance()  # the fake learner is done at once: handed and ended in one call
    assert outcome is not None and [g.group_id for g in outcome.groups] == [gid] and outcome.result.loss == 0.1
    ((trajs, weights, version, partial),) = s.actors.learners.calls
    assert [(t.group_id, t.rollout_index) for t in trajs] == [(gid, 0), (gid, 1)] and version == 0 and not partial
    assert weights["empty_turn_model_response"] > 1.0  # the coordinator's weights, after this batch's tags
    assert (s.state.step, s.state.version) == (1, 1) and s.publisher.published == [1]
    assert s.replay.queue.policy_version == 1 and gid not in s.ledger.in_flight  # consumed exactly once


def test_a_step_the_filter_keeps_empty_is_skipped_without_a_new_version(steps):
    s, sender = steps(unfilled="skip")
    deliver(s, sender, (0.0, 0.0))
    assert s.advance() is None  # one filtered group: patience 2 not spent
    deliver(s, sender, (1.0, 1.0))
    outcome = s.advance()
    assert outcome is not None and outcome.groups == [] and outcome.result is None
    assert outcome.interface.interface_version >= 0  # the round closed all the same
    assert (s.state.step, s.state.version) == (1, 0) and s.publisher.published == [] and not s.actors.learners.calls
    assert s.ledger.counters.filtered == 2


def test_with_unfilled_partial_the_step_trains_on_what_is_ready(steps):
    s, sender = steps(unfilled="partial", groups_per_step=2)
    gid = deliver(s, sender, (1.0, 0.0))  # one trainable group of the two a batch wants
    for _ in range(4):  # fill_patience 2 x 2 groups a step, all filtered
        deliver(s, sender, (0.0, 0.0))
    outcome = s.advance()
    ((trajs, _, _, partial),) = s.actors.learners.calls
    assert partial and {t.group_id for t in trajs} == {gid}
    assert outcome is not None and (s.state.step, s.state.version) == (1, 1)
