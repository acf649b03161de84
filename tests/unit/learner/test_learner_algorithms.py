"""GRPO advantages, A-Patch and dynamic tag weights: hand-computed examples and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.coordinator.capability_state import CapabilityState, TagCounts
from actors.coordinator.tag_weights import DynamicWeightConfig, TagWeights, target_weight
from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS as BASE
from learner.advantages import apply_scale, grpo_advantages, trajectory_scale


def test_grpo_advantages_by_hand():
    adv = grpo_advantages([1, 0, 0, 0])
    # mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert adv.advantages == pytest.approx(
        [0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)]
    )
    assert not adv.zero_variance


@pytest.mark.parametrize("rewards", [[1, 1, 1], [0, 0], [0.3]])
def test_zero_variance_groups_give_zero_and_are_flagged(rewards):
    adv = grpo_advantages(rewards)
    assert adv.zero_variance and adv.advantages == [0.0] * len(rewards)


def test_apatch_scale_by_hand():
    # (1.5 + 1.0 + 2.0) / 3 = 1.5; excluded tags are left out of the mean
    assert trajectory_scale([T.EMPTY_TURN, T.PASS, T.SPURIOUS_TOOL_CALL, T.CHECKER_ERROR], BASE) == pytest.approx(1.5)
    assert (
        trajectory_scale([T.INSTANCE_MISMATCH, T.INSTANCE_MISMATCH], {**BASE, T.INSTANCE_MISMATCH: 0.2}) == 0.5
    )  # clipped up
    assert trajectory_scale([T.SPURIOUS_TOOL_CALL], {**BASE, T.SPURIOUS_TOOL_CALL: 3.0}) == 2.0  # clipped down
    assert trajectory_scale([], BASE) == 1.0 and trajectory_scale([T.GT_ERROR], BASE) == 1.0
    assert trajectory_scale(["never_seen_tag"], BASE) == 1.0  # unknown weight
    assert apply_scale(-2.0, 1.5, "positive") == -2.0 and apply_scale(-2.0, 1.5, "negative") == -3.0
    assert apply_scale(2.0, 0.5, "all") == 1.0


@given(
    tags=st.lists(st.sampled_from([*T.RELEASED_TAGS, "odd"]), max_size=8),
    weights=st.dictionaries(st.sampled_from([*T.RELEASED_TAGS, T.UNKNOWN]), st.floats(0.01, 10)),
    advantage=st.floats(-50, 50),
    apply_to=st.sampled_from(["all", "positive", "negative"]),
)
def test_scale_is_clipped_and_never_flips_the_sign(tags, weights, advantage, apply_to):
    w = trajectory_scale(tags, weights)
    assert 0.5 <= w <= 2.0
    scaled = apply_scale(advantage, w, apply_to)
    assert math.copysign(1, scaled) == math.copysign(1, advantage) or advantage == 0


@given(rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16))
def test_advantages_preserve_the_verifier_ranking(rewards):
    adv = grpo_advantages(rewards).advantages
    for a, ra in zip(adv, rewards):
        for b, rb in zip(adv, rewards):
            if ra > rb:
                assert a > b
    assert abs(sum(adv)) < 1e-6


def test_dynamic_weights_three_ema_steps_by_hand():
    cfg = DynamicWeightConfig(beta=0.25, alpha=1.0, confidence=32)
    weights = TagWeights(BASE, cfg)
    counts = {
        T.EMPTY_TURN: TagCounts(16, 0, 0.0, 0),
        T.PASS: TagCounts(48, 40, 40.0, 0),
        T.CHECKER_ERROR: TagCounts(100, 0, 0.0, 0),
    }
    # N = 64 (checker_error excluded); empty: prevalence 0.25, reward_mean 0, trust 16/32
    target = 1.5 * (1 + 1.0 * 0.25 * 1.0 * 0.5)  # 1.6875
    expected = 1.5
    for _ in range(3):
        expected = 0.75 * expected + 0.25 * target
        w = weights.update(counts)
    assert w[T.EMPTY_TURN] == pytest.approx(expected)  # 1.5 -> 1.546875 -> 1.58203125 -> 1.6083984375
    assert expected == pytest.approx(1.6083984375)
    assert w[T.PASS] == 1.0 and w[T.CHECKER_ERROR] == 1.0
    # Unseen tags relax toward their base weight.
    assert w[T.SPURIOUS_TOOL_CALL] == pytest.approx(2.0) and w[T.INSTANCE_MISMATCH] == pytest.approx(0.6)


def test_zero_in_config_means_zero():
    frozen = TagWeights(BASE, DynamicWeightConfig(beta=0.0))
    assert frozen.update({T.EMPTY_TURN: TagCounts(64, 0, 0.0, 0)})[T.EMPTY_TURN] == 1.5
    assert target_weight(1.5, 64, 64, 0.0, DynamicWeightConfig(alpha=0.0)) == 1.5
    assert target_weight(1.0, 1, 2, 0.0, DynamicWeightConfig(confidence=0)) == pytest.approx(1.5)  # full trust
    with pytest.raises(ValueError):
        DynamicWeightConfig(beta=1.5)


def test_capability_state_views_window_and_exact_restore():
    state = CapabilityState()
    state.record(
        "base",
        "multi_turn_base_1",
        [T.PASS, T.STATE_MISMATCH, T.STATE_MISMATCH],
        reward=0.0,
        success=False,
        progress=1 / 3,
    )
    state.record("miss_func", "multi_turn_miss_func_2", [T.PASS], reward=1.0, success=True, progress=1.0)
    tags = state.tag_counts("tag")
    assert tags[T.STATE_MISMATCH] == TagCounts(2, 0, 0.0, 2) and tags[T.PASS] == TagCounts(2, 1, 1.0, 1)
    assert state.tag_counts("category_tag", prefix="base::")[T.STATE_MISMATCH].count == 2
    assert state.tag_counts("position")["late::" + T.STATE_MISMATCH].count == 1
    assert state.tag_counts("task")["multi_turn_miss_func_2::pass"].successes == 1
    assert state.tag_counts("category")["base"].count == 3
    restored = CapabilityState.from_dict(state.to_dict())
    assert restored == state and restored.version == 2
    state.end_epoch()
    assert state.tag_counts("tag", source="window") == {} and state.tag_counts("tag") == tags  # auto: totals
    state.record("base", "t", [T.EMPTY_TURN], 0.0, False, 0.0)
    assert set(state.tag_counts("tag")) == {T.EMPTY_TURN}  # auto: the window once it has data
    with pytest.raises(ValueError, match="unknown view"):
        state.tag_counts("nope")


def test_base_weight_tables_by_name():
    from env_pool.tags import PAPER_BASE_WEIGHTS

    assert TagWeights("paper").to_dict()[T.INVALID_TOOL_CALL] == PAPER_BASE_WEIGHTS[T.INVALID_TOOL_CALL]
    assert TagWeights().to_dict()[T.CORRECT_ABSTENTION] == 1.8
    with pytest.raises(ValueError, match="released, paper"):
        TagWeights("mine")


def _trajectory(index: int, reward: float, tags: list[str]):
    from replay.messages import Trajectory

    return Trajectory(
        task_id="t",
        category="base",
        env="bfcl",
        group_id="g",
        rollout_index=index,
        interface_version=0,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, 0.0],
        prompt_length=1,
        segments=[],
        reward=reward,
        success=bool(reward),
        progress=reward,
        tags=tags,
        labels=[],
        error_type=None,
        outcome="completed",
        num_tool_calls=1,
        num_steps=1,
    )


def test_apatch_clip_range_is_config():
    from learner.batch import APatchConfig, build_samples

    group = [_trajectory(0, 1.0, [T.SPURIOUS_TOOL_CALL]), _trajectory(1, 0.0, [T.INSTANCE_MISMATCH])]
    assert [s.scale for s in build_samples(group, BASE)[0]] == pytest.approx([2.0, 0.6])  # default [0.5, 2.0]
    narrow, _ = build_samples(group, BASE, APatchConfig(scale_min=0.8, scale_max=1.2))
    assert [s.scale for s in narrow] == pytest.approx([1.2, 0.8])
    assert [s.advantage for s in narrow] == pytest.approx(
        [1.2 * narrow[0].raw_advantage, 0.8 * narrow[1].raw_advantage]
    )
    for lo, hi in [(0.0, 1.0), (-1.0, 2.0), (2.0, 1.0)]:
        with pytest.raises(ValueError, match="0 < scale_min <= scale_max"):
            APatchConfig(scale_min=lo, scale_max=hi)


@given(
    rewards=st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=2, max_size=8),
    faulted=st.sets(st.integers(0, 7), max_size=6),
)
def test_group_statistics_with_members_removed_equal_grpo_over_the_rest(rewards, faulted):
    """Infra-faulted members leave the group (replay/queue.py puts stand-ins in their places): the
    advantages of the rest are GRPO's over the rest alone, and the stand-ins carry none."""
    from dataclasses import replace

    from learner.batch import build_samples
    from replay.messages import InfraFault
    from replay.queue import stand_in

    group = [_trajectory(i, r, []) for i, r in enumerate(rewards)]
    gone = {i for i in faulted if i < len(group)}
    rest = [t for t in group if t.rollout_index not in gone]
    if not rest:
        return
    members = [
        stand_in(rest[0], replace(t, infra_fault=InfraFault("generation_error", "x"))) if t.rollout_index in gone else t
        for t in group
    ]
    samples, stats = build_samples(members, BASE)
    expected = iter(grpo_advantages([t.reward for t in rest]).advantages)
    for t, s in zip(members, samples):
        assert s.raw_advantage == (0.0 if t.padding else pytest.approx(next(expected)))
        assert (s.num_tokens == 0) == t.padding  # a stand-in has nothing to train
    assert stats.reward_mean == pytest.approx(sum(t.reward for t in rest) / len(rest))
    assert stats.zero_variance_groups == grpo_advantages([t.reward for t in rest]).zero_variance
