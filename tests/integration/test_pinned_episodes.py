"""Pinned episodes (trainer.episode_version=pinned) on real vLLM CPU with the tiny model and LoRA
adapters from a real learner: an update lands between an episode's turns; the episode finishes on
the version it started on (every span of it carries that version) while the next episode starts on
the new one, the replica holding both adapters until the pinned episodes end, then dropping the old
one. The same update under ``latest`` moves an episode to the new version mid-way: what pinning is for.

The episodes are played by rollout/play.py itself against an environment that always takes three
turns (the tiny model's random text ends the built-in ones after one), through an in-process
Generator over the replica's coroutines, the calls a Ray actor handle would make.
"""

from __future__ import annotations

import pytest

from env_pool.base import Environment, EpisodeResult, Message, Outcome, StepResult
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationRequest, Generator, SamplingConfig
from rollout.play import run_group
from tests.integration.test_async_generator import Loop
from tests.integration.test_learner_lora import lora_learner
from tests.integration.test_lora_async_generation import trained

TURNS = 3
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5)


class ThreeTurns(Environment):
    """Three user turns whatever the assistant says; reward 1 for finishing."""

    kind = "three_turns"

    def __init__(self) -> None:
        super().__init__()
        self._messages: list[Message] = []
        self._turn = 0
        self._outcome: Outcome | None = None

    def task_ids(self, split: str = "all") -> list[str]:
        return ["three_0"]

    def reset(self, task_id, interface=None):
        self._messages = [{"role": "user", "content": "Say a word."}]
        self._turn, self._outcome = 0, None
        return list(self._messages)

    def step(self, assistant_text):
        self._messages.append({"role": "assistant", "content": assistant_text})
        self._turn += 1
        done = self._turn >= TURNS
        reply = [] if done else [{"role": "user", "content": "Another."}]
        self._messages += reply
        if done:
            self._outcome = Outcome.COMPLETED
        return StepResult(reply, self._turn - 1, True, done, self._outcome, 0)

    def end(self, outcome):
        self._outcome = outcome

    def result(self):
        return EpisodeResult(
            self.kind, "three_0", "three", 1.0, True, 1.0, ["pass"], ["pass"], None,
            (self._outcome or Outcome.ABORTED).value, 0, self._turn, 0, 0, [], 0.0, 0.0,
        )  # fmt: skip

    @property
    def messages(self):
        return list(self._messages)

    @property
    def done(self):
        return self._outcome is not None

    def reference_turns(self, task_id):
        return [["word"]] * TURNS


class InProcess(Generator):
    """The replica's coroutines called from this thread, as a Ray actor handle calls them; ``after``:
    run after the given call number returns (an update landing between an episode's turns)."""

    def __init__(self, replica, loop: Loop, after: dict[int, object]) -> None:
        self.replica, self.loop, self.after, self.calls = replica, loop, after, 0
        self.max_model_len = loop.run(replica.max_model_len())

    @property
    def tokenizer(self):
        return self.replica.tokenizer

    @property
    def policy_version(self):  # type: ignore[override]
        return self.replica.policy_version()

    def generate(self, requests, sampling):
        out = self.loop.run(self.replica.generate(requests, sampling))
        self.calls += 1
        hook = self.after.pop(self.calls, None)
        if hook is not None:
            hook()
        return out

    def end_episodes(self, episode_ids):
        self.loop.run(self.replica.end_episodes(episode_ids))

    def update_weights(self, version, source):
        return self.loop.run(self.replica.update_weights(version, source))


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="module")
def replica(tiny_path):
    from actors.generation.async_vllm_engine import AsyncVllmGenerator

    loop = Loop()
    gen = AsyncVllmGenerator(
        tiny_path,
        max_model_len=512,
        cpu_kv_cache_gb=0.25,
        dtype="float32",
        weight_sync="reload",
        max_lora_rank=8,
        max_loras=2,
        update_mode="pause",
        update_timeout_s=300.0,
    )
    loop.run(gen.max_model_len())
    yield gen, loop
    loop.run(gen.close())


@pytest.fixture(scope="module")
def chat(replica):
    return ChatTokenizer(replica[0].tokenizer)


@pytest.fixture(scope="module")
def adapters(tiny_path):
    learner = lora_learner(tiny_path)
    return {v: trained(learner, tiny_path, v) for v in (1, 2, 3)}


def versions(traj) -> set[int]:
    return {s.policy_version for s in traj.segments}


def test_an_update_mid_episode_leaves_a_pinned_episode_on_its_version(replica, chat, adapters):
    gen, loop = replica
    loop.run(gen.update_weights(1, adapters[1]))
    held = {}

    def publish_v2():  # after the group's first turn: both episodes have run on v1 and go on
        loop.run(gen.update_weights(2, adapters[2]))
        held["loaded"], held["pinned"] = gen.adapters.served.loaded(), gen.adapters.pins.episodes(1)

    first = run_group(
        ThreeTurns, InProcess(gen, loop, {1: publish_v2}), chat, "three_0", 2, SAMPLING, group_id="a", pinned=True
    )
    # Between turns no request ran on v1, yet it stayed: the two episodes were pinned to it.
    assert held == {"loaded": [1, 2], "pinned": 2}
    assert [t.num_steps for t in first] == [TURNS, TURNS] and not any(t.infra_fault for t in first)
    assert [versions(t) for t in first] == [{1}, {1}]  # the whole episode on the version it started on
    assert gen.policy_version() == 2 and gen.adapters.served.loaded() == [2]  # ended: v1 dropped
    second = run_group(ThreeTurns, InProcess(gen, loop, {}), chat, "three_0", 2, SAMPLING, group_id="b", pinned=True)
    assert [versions(t) for t in second] == [{2}, {2}]  # new episodes start on the newest
    assert gen.adapters.pins.held() == set()


def test_under_latest_the_same_update_moves_the_episode_to_the_new_version(replica, chat, adapters):
    gen, loop = replica
    assert gen.policy_version() == 2

    def publish_v3():
        loop.run(gen.update_weights(3, adapters[3]))

    (traj,) = run_group(ThreeTurns, InProcess(gen, loop, {1: publish_v3}), chat, "three_0", 1, SAMPLING, group_id="c")
    assert [s.policy_version for s in traj.segments][0] == 2 and versions(traj) == {2, 3}
    assert gen.adapters.served.loaded() == [3]  # nothing pinned: v2 went as soon as no request used it


def test_a_pinned_request_for_a_version_the_replica_dropped_is_refused_as_an_infra_fault(replica, chat):
    gen, loop = replica
    with pytest.raises(ValueError, match=r"episode gone-0 is pinned to policy v1, which this replica no longer serves"):
        loop.run(gen.generate([GenerationRequest("gone-0-1", [1, 2, 3], 4, 1, "gone-0", 1)], SAMPLING))
