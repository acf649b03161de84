"""A reward-only verdict: an env without a diagnosis vocabulary returns a reward (a number, or a
``Verdict`` with the reward alone); its turns are tagged ``unknown``, the A-Patch weights leave its
advantages at scale 1 however many steps the coordinator takes, no guideline turns on, and the
closing note says the interface had nothing to act on instead of saying nothing."""

from __future__ import annotations

import pytest

from actors.coordinator.coordinator import Coordinator
from actors.coordinator.tag_weights import TagWeights
from env_pool import tags as T
from env_pool.base import play_scripted
from env_pool.contract import check_episode
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import Verdict
from examples.thermostat.env import ThermostatEnv
from learner.batch import build_samples
from replay.control_messages import TagSummary
from seal.run.summary import interface_text
from tests.unit.replay.test_replay import traj


class BareReward(ThermostatEnv):
    """The thermostat's verifier, its diagnosis thrown away: the share of turns passed, nothing else."""

    def judge(self):
        return super().judge().progress


class RewardOnlyVerdict(ThermostatEnv):
    def judge(self):
        return Verdict(reward=float(super().judge().reward))


@pytest.mark.parametrize("env_class", [BareReward, RewardOnlyVerdict])
def test_a_reward_alone_is_a_verdict_with_every_turn_unknown(env_class):
    env = env_class()
    check_episode(env, "thermo_0", "set")  # preflight's check takes it
    result = play_scripted(env, "thermo_0", env.reference_turns("thermo_0"))
    assert (result.reward, result.success, result.progress) == (1.0, True, 1.0)
    assert result.tags == result.labels == [T.UNKNOWN, T.UNKNOWN] and result.error_type is None
    silent = play_scripted(env, "thermo_0", [["No."], ["No."]])
    assert silent.tags == [T.UNKNOWN, T.UNKNOWN] and silent.progress == silent.reward


def _summary(reward: float) -> TagSummary:
    return TagSummary(
        task_id="thermo_0",
        category="set",
        tags=[T.UNKNOWN, T.UNKNOWN],
        labels=[T.UNKNOWN, T.UNKNOWN],
        reward=reward,
        success=reward == 1.0,
        progress=reward,
        interface_version=0,
    )


@pytest.mark.parametrize("vocabulary", ["released", "paper"])
def test_the_weights_leave_unknown_turns_at_scale_1_and_no_guideline_turns_on(vocabulary):
    interface = InterfaceState(guidelines=True, schema_lite=True, error_feedback=True)
    coordinator = Coordinator(interface, TagWeights(vocabulary), vocabulary=vocabulary)
    for step in range(10):  # a poorly rewarded, prevalent "tag": the pressure that moves any other tag
        for reward in (0.0, 0.0, 0.5, 0.0):
            coordinator.record(_summary(reward))
        weights = coordinator.step_weights()
        assert coordinator.end_round() == interface  # no guideline: the same version
    assert weights[T.UNKNOWN] == 1.0
    group = [traj("g", i, reward=r) for i, r in enumerate((0.0, 0.5))]
    group = [t.__class__(**{**t.__dict__, "tags": [T.UNKNOWN], "labels": [T.UNKNOWN]}) for t in group]
    samples, _ = build_samples(group, weights)
    assert [s.scale for s in samples] == [1.0, 1.0] and [s.advantage for s in samples] == [
        s.raw_advantage for s in samples
    ]


def test_the_closing_note_says_the_interface_had_nothing_to_act_on():
    rows = [
        {"step": s, "interface_version": 0, "active_guidelines": [], "tag_fractions": {T.UNKNOWN: 1.0}} for s in (1, 2)
    ]
    assert interface_text(rows, 0) == (
        "v0 throughout; guidelines turned on: none (the env's verdicts carry no diagnosis tags, every turn "
        "unknown: the interface and the A-Patch weights had nothing to act on)"
    )
    rows[1]["tag_fractions"] = {T.UNKNOWN: 0.5, T.PASS: 0.5}  # a diagnosed turn: the usual line
    assert interface_text(rows, 0) == "v0 throughout; guidelines turned on: none"
