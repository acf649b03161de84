"""Partial credit end to end: a verdict's reward in [0, 1] reaches the episode result (success at the
env's threshold), GRPO's advantages, the zero-variance filter, the coordinator's statistics and the
console, each computing on the float itself. The binary envs are held unchanged by
tests/unit/env_pool/test_unchanged_envs.py."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest

from actors.coordinator.capability_state import CapabilityState
from env_pool.base import play_scripted
from env_pool.contract import check_episode
from env_pool.tool_calls import ToolCall, render_calls
from examples.thermostat.env import ThermostatEnv
from learner.advantages import GRPO_EPS
from learner.batch import build_samples
from replay.queue import ReplayQueue
from seal.run.progress import rewards_text
from tests.unit.replay.test_replay import traj


class TurnCredit(ThermostatEnv):
    """The thermostat graded by turns: each passed turn earns its share of the reward."""

    def judge(self):
        verdict = super().judge()
        return dataclasses.replace(verdict, reward=verdict.progress)


def test_partial_credit_reaches_the_episode_result_and_success_is_the_threshold():
    env = TurnCredit()
    right = render_calls([ToolCall("get_temperature", {"room": "bathroom"})], "python")  # thermo_1: the bathroom
    wrong = render_calls([ToolCall("set_temperature", {"room": "bathroom", "celsius": 10})], "python")
    half = play_scripted(env, "thermo_1", [[right, "It is warm."], [wrong, "Done."]])
    assert (half.reward, half.success, half.tags) == (0.5, False, ["pass", "state_mismatch"])
    check_episode(env, "thermo_1", "adjust")  # the reference earns 1.0; the silent and partial agents less

    class HalfIsEnough(TurnCredit):
        success_threshold = 0.5

    lenient = play_scripted(HalfIsEnough(), "thermo_1", [[right, "It is warm."], [wrong, "Done."]])
    assert (lenient.reward, lenient.success) == (0.5, True)


def test_grpo_advantages_of_graded_rewards_are_the_formulas():
    rewards = [0.2, 0.5, 0.9]
    group = [traj("g", i, reward=r) for i, r in enumerate(rewards)]
    samples, stats = build_samples(group, weights={})
    mean = sum(rewards) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 2)  # unbiased, as verl
    assert [s.raw_advantage for s in samples] == pytest.approx([(r - mean) / (std + GRPO_EPS) for r in rewards])
    assert [s.scale for s in samples] == [1.0, 1.0, 1.0]  # every turn "pass": A-Patch weight 1
    assert stats.reward_mean == pytest.approx(mean) and stats.zero_variance_groups == 0


def test_equal_graded_rewards_are_filtered_and_unequal_ones_train():
    q = ReplayQueue(group_size=2, groups_per_batch=1, filter_groups="zero_variance", reissue_after_s=900.0)
    for i in range(2):
        q.add(traj("flat", i, reward=0.5))
    assert q.take_batch() is None and q.stats.filtered == 1
    q.add(traj("close", 0, reward=0.5))
    q.add(traj("close", 1, reward=0.6))
    assert [g.group_id for g in q.take_batch()] == ["close"]


def test_the_coordinator_and_the_console_read_the_float():
    state = CapabilityState()
    for reward in (0.25, 0.75):
        state.record("adjust", "thermo_1", ["pass"], reward, reward >= 1.0, reward)
    assert state.tag_counts("tag")["pass"].reward_mean == pytest.approx(0.5)
    assert rewards_text([0.2, 0.5, 0.9]) == "rewards 0.2 0.5 0.9 (mean 0.53)"
    assert rewards_text([0.25, 1.0], faults=["", "deadline"]) == "rewards 0.25 - (mean 0.25)"


def test_a_trajectory_carries_the_float_on_the_wire():
    from replay.wire import decode, encode

    t = replace(traj("g", 0, reward=0.375), success=False)
    assert decode(encode(t)).reward == 0.375
