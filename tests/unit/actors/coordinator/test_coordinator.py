"""The coordinator: capability state -> interface evolution and tag weights."""

from __future__ import annotations

from actors.coordinator.coordinator import Coordinator
from actors.coordinator.tag_weights import TagWeights
from env_pool import tags as T
from env_pool.interface.state import InterfaceState
from replay.control_messages import TagSummary
from replay.messages import Segment, Trajectory


def summary(tags, reward=0.0, labels=None):
    return TagSummary(
        task_id="multi_turn_base_1",
        category="base",
        tags=tags,
        labels=labels or [T.MISSING_TOOL_CALL] * len(tags),
        reward=reward,
        success=bool(reward),
        progress=0.0,
        interface_version=0,
    )


def test_closed_loop_evolves_interface_and_weights():
    c = Coordinator(InterfaceState(guidelines=True), TagWeights())
    for _ in range(10):
        c.record(summary([T.STATE_MISMATCH]))
    weights = c.step_weights()
    assert weights[T.STATE_MISMATCH] > 1.0
    state = c.end_round()
    assert state.version == 1 and state.active_guidelines == ("state_aware",)
    for _ in range(30):
        c.record(summary([T.EMPTY_TURN]))
    assert c.end_round().active_guidelines[0] == "active_respond"


def test_without_closed_loop_the_profile_freezes_after_round_one():
    c = Coordinator(InterfaceState(guidelines=True), TagWeights(), closed_loop=False)
    for _ in range(10):
        c.record(summary([T.STATE_MISMATCH]))
    first = c.end_round()
    for _ in range(50):
        c.record(summary([T.EMPTY_TURN]))
    assert c.end_round() is first


def test_paper_vocabulary_drives_weights_from_labels():
    c = Coordinator(InterfaceState(), TagWeights("paper"), vocabulary="paper")
    for _ in range(40):
        c.record(summary([T.PASS], labels=[T.MISSING_TOOL_CALL]))
    assert c.step_weights()[T.MISSING_TOOL_CALL] > 1.5


def test_state_round_trips():
    c = Coordinator(InterfaceState(guidelines=True), TagWeights())
    for _ in range(9):
        c.record(summary([T.STATE_MISMATCH]))
    c.step_weights()
    c.end_round()
    d = Coordinator(InterfaceState(guidelines=True), TagWeights())
    d.load_state(c.state())
    assert d.state() == c.state()


def test_a_trajectory_that_generated_nothing_counts_from_its_start_version():
    t = Trajectory(
        task_id="x",
        category="base",
        env="bfcl",
        group_id="g",
        rollout_index=0,
        interface_version=0,
        token_ids=[1, 2],
        loss_mask=[0, 0],
        logprobs=[0.0, 0.0],
        prompt_length=2,
        segments=[],
        reward=0.0,
        success=False,
        progress=0.0,
        tags=[],
        labels=[],
        error_type=None,
        outcome="context_overflow",
        num_tool_calls=0,
        num_steps=0,
        start_version=5,
    )
    assert t.policy_version == 5
    t.segments.append(Segment(1, 2, 4))
    assert t.policy_version == 4


def _from_config(*overrides: str) -> Coordinator:
    """Built as the pipeline builds it (seal.runtime.actor_set), from the composed config."""
    from omegaconf import OmegaConf

    from seal.config import compose
    from seal.runtime.actor_set import make_coordinator

    cfg = compose(list(overrides))
    spec = lambda node: OmegaConf.to_container(node, resolve=True)
    return make_coordinator(
        spec(cfg.interface), spec(cfg.tag_weights), True, False, "released", spec(cfg.guideline_policy)
    )


def test_guideline_thresholds_come_from_the_config():
    from env_pool.interface.guidelines import GuidelinePolicy

    default, strict = _from_config(), _from_config("guideline_policy.min_count=11", "guideline_policy.top_k=0")
    assert default.policy == GuidelinePolicy(min_count=8, min_prevalence=0.10, max_reward_mean=0.6, top_k=3)
    assert (strict.policy.min_count, strict.policy.top_k) == (11, 0)
    for c in (default, strict):
        for _ in range(10):
            c.record(summary([T.STATE_MISMATCH]))
    assert default.end_round().active_guidelines == ("state_aware",)
    assert strict.end_round().active_guidelines == ()
