"""One metrics row from values alone (seal/run/step_metrics.py): no pipeline, no Ray."""

from __future__ import annotations

from dataclasses import dataclass

from replay.messages import GroupReport, Segment, Trajectory
from seal.run.step_metrics import RunFacts, StepOutcome, StepWindow

REPLAY = {
    "dropped_stale": 1,
    "rejected": 2,
    "unauthorized": 3,
    "abandoned": 0,
    "frames_by_peer": {"10.0.0.2": 9},
    "duplicates": 0,
}


@dataclass
class Group:
    trajectories: list
    staleness: int = 0


def traj(group: str, reward: float, version: int = 0, category: str = "base") -> Trajectory:
    return Trajectory(
        task_id="t",
        category=category,
        env="toy",
        group_id=group,
        rollout_index=0,
        interface_version=0,
        token_ids=list(range(12)),
        loss_mask=[0] * 8 + [1] * 4,
        logprobs=[0.0] * 8 + [-0.5] * 4,
        prompt_length=8,
        segments=[Segment(8, 12, version)],
        reward=reward,
        success=bool(reward),
        progress=1.0,
        tags=["pass"],
        labels=["pass"],
        error_type=None,
        outcome="completed",
        num_tool_calls=1,
        num_steps=1,
        timings={},
    )


def report(group: str) -> GroupReport:
    return GroupReport(
        slot=0,
        group_id=group,
        task_id="t",
        actor="env-0",
        sent=2,
        interface_version=0,
        start_version=0,
        prompt_tokens=16,
        cached_prompt_tokens=8,
        generated_tokens=8,
        generate_s=1.0,
        env_s=0.5,
        send_s=0.1,
        wall_s=2.0,
        env_steps=2,
        tool_calls=1,
    )


def facts(step: int, version: int, busy: float) -> RunFacts:
    replicas = {"gen-0": {"busy_s": busy, "requests": 4}}
    return RunFacts(
        step=step,
        policy_version=version,
        env_actors=2,
        filtered_total=1,
        reissued=0,
        replay=REPLAY,
        control_unauthorized=1,
        weight_rounds_failed=0,
        publish_s=0.25,
        generator_restores=0,
        replicas=replicas,
        replica_count=1,
        fleet={"generator_replicas": 1},
    )


def test_a_trained_step_and_a_skipped_one():
    window = StepWindow("async", max_new_tokens=4, learner_world_size=1, generator_replicas=1, skipped_overlong=2)
    start = window.started
    window.add_report(report("g1"))
    batch = [Group([traj("g1", 1.0), traj("g1", 0.0)], staleness=1)]
    result = {"sequence_tokens": 24, "loss": 0.5, "seconds": 1.0}
    interface = {"interface_version": 0, "active_guidelines": [], "state": {"version": 0}}
    row = window.row(StepOutcome(batch, result, interface, 1.5), facts(1, 1, busy=1.0), start + 4.0)
    assert (row["step"], row["policy_version"], row["mode"], row["skipped"], row["trained_groups"]) == (
        1,
        1,
        "async",
        False,
        1,
    )
    assert row["reward_mean"] == 0.5 and row["staleness_max"] == 1 and row["loss"] == 0.5
    assert row["tokens_per_s_per_device"] == 24 / (4.0 * 2) and row["devices"] == 2
    assert row["unauthorized"] == 3 + 1 and row["dropped"] == 1 and row["publish_s"] == 0.25
    assert row["response_truncated_frac"] == 1.0  # every 4-token segment hit max_new_tokens=4
    assert (
        row["generator_replicas"] == 1 and row["skipped_overlong_tasks"] == 2 and row["idle_ratio"]["generator"] is None
    )
    assert row["wait_s"]["learner"] == 1.5 and row["groups_generated"] == 1 and row["_interface"] == {"version": 0}

    window.add_filtered(Group([traj("g2", 0.0), traj("g2", 0.0)]))
    row = window.row(StepOutcome([], None, interface, 0.0), facts(2, 1, busy=3.0), start + 8.0)
    assert row["skipped"] and row["trained_groups"] == 0 and row["filtered_groups"] == 1 and row["loss"] is None
    assert row["tokens_per_s_per_device"] == 0.0 and row["groups_generated"] == 0
    assert row["idle_ratio"]["generator"] == 0.5  # 2 busy seconds of the 4-second window
