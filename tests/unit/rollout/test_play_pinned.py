"""Pinned episodes on the playing side (rollout/play.py, trainer.episode_version=pinned): each request
names its episode, every turn after the first carries the version the first came back on, and the
generator is told when the episodes are over, whatever ended them. The replica's side (serving that
version): tests/integration/test_pinned_episodes.py."""

from __future__ import annotations

import pytest

from env_pool.toy.env import ToyToolEnv
from rollout.generator import GeneratorUnavailable, SamplingConfig
from rollout.play import run_group
from tests.unit.rollout.test_play import ScriptedGenerator, chat, toy_reference  # noqa: F401  (chat: a fixture)


class PinRecorder(ScriptedGenerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests, self.ended = [], []

    def generate(self, requests, sampling):
        self.requests += [(r.request_id, r.episode_id, r.pin_version) for r in requests]
        return super().generate(requests, sampling)

    def end_episodes(self, episode_ids):
        self.ended.append(list(episode_ids))


@pytest.mark.parametrize("lockstep", [True, False])
def test_each_turn_after_the_first_carries_the_episodes_version(chat, lockstep):
    generator = PinRecorder(chat, {0: [toy_reference("toy_4")], 1: [toy_reference("toy_4")]}, versions={0: 3})
    trajs = run_group(
        ToyToolEnv,
        generator,
        chat,
        "toy_4",
        2,
        SamplingConfig(max_new_tokens=64),
        group_id="g",
        lockstep=lockstep,
        pinned=True,
    )
    by_request = sorted(generator.requests)
    assert by_request == [("g-0-0", "g-0", None), ("g-0-1", "g-0", 3), ("g-1-0", "g-1", None), ("g-1-1", "g-1", 3)]
    assert generator.ended == [["g-0", "g-1"]]
    assert all({s.policy_version for s in t.segments} == {3} for t in trajs)


def test_latest_names_no_episode_and_ends_none(chat):
    generator = PinRecorder(chat, {0: [toy_reference("toy_4")]})
    run_group(ToyToolEnv, generator, chat, "toy_4", 1, SamplingConfig(max_new_tokens=64), group_id="g")
    assert [(e, v) for _, e, v in generator.requests] == [(None, None), (None, None)] and generator.ended == []


def test_a_group_lost_with_its_generator_still_ends_its_episodes(chat):
    generator = PinRecorder(chat, {0: [toy_reference("toy_4")]})
    generator.fail = GeneratorUnavailable("gone")
    with pytest.raises(GeneratorUnavailable):
        run_group(ToyToolEnv, generator, chat, "toy_4", 1, SamplingConfig(max_new_tokens=64), group_id="g", pinned=True)
    assert generator.ended == [["g-0"]]
