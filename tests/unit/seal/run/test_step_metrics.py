"""One metrics row from values alone (seal/run/step_metrics.py): no pipeline, no Ray."""

from __future__ import annotations

from dataclasses import replace

from actors.generation.server import ServerCounters
from env_pool.interface.state import InterfaceState
from replay.control_messages import GroupReport, GroupStats, InterfaceStateMessage, RoundEnd
from replay.messages import InfraFault, Segment, Trajectory
from replay.queue import Group as QueueGroup
from replay.queue import QueueStats, stand_in
from replay.transport import ReplayCounters, ServerStats
from seal.run.step_metrics import RunFacts, StepOutcome, StepWindow, sum_token_books
from tests.unit.learner.step_results import step_result

RAW = InterfaceStateMessage.from_dict(InterfaceState().to_dict())  # the interface of every round here

SERVER = ServerStats(rejected=2, unauthorized=3, frames_by_peer={"10.0.0.2": 9})


def Group(trajectories: list, staleness: int = 0, faulted: tuple = ()) -> QueueGroup:
    return QueueGroup(trajectories[0].group_id, trajectories, staleness, 1.0, faulted)


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


def report(group: str, generated: int = 8) -> GroupReport:
    return GroupReport(
        slot=0,
        group_id=group,
        task_id="t",
        actor="env-0",
        sent=2,
        interface_version=0,
        start_version=0,
        generation=GroupStats(prompt_tokens=16, cached_prompt_tokens=8, generated_tokens=generated, generate_s=1.0),
        env_s=0.5,
        send_s=0.1,
        wall_s=2.0,
        env_steps=2,
        tool_calls=1,
    )


def facts(step: int, version: int, busy: float, generated: int | None = 0, lost: int = 0) -> RunFacts:
    """``generated``: the generator's count since the run started (GeneratorFleet.generated_tokens)."""
    counters = ServerCounters(requests=4, updates=1, update_s=0.1, busy_s=busy, generated_tokens=generated or 0)
    replicas = {"gen-0": replace(counters.stats(policy_version=1), instance="", wall_s=10.0)}  # a blocking replica
    return RunFacts(
        step=step,
        policy_version=version,
        env_actors=2,
        filtered_total=1,
        reissued=0,
        given_up=0,
        replay=ReplayCounters(QueueStats(dropped_stale=1, lost_tokens=lost), SERVER),
        control_unauthorized=1,
        weight_rounds_failed=0,
        publish_s=0.25,
        generator_restores=0,
        replicas=replicas,
        generated_tokens=generated,
        replica_count=1,
        fleet={"generator_replicas": 1},
    )


def test_a_trained_step_and_a_skipped_one():
    window = StepWindow("async", max_new_tokens=4, learner_world_size=1, generator_replicas=1, skipped_overlong=2)
    start = window.started
    window.add_report(report("g1"))
    batch = [Group([traj("g1", 1.0), traj("g1", 0.0)], staleness=1)]
    window.decide("trained", batch[0])  # when the learner took it (seal/run/learner_steps.py)
    result = step_result(sequence_tokens=24, loss=0.5, seconds=1.0)
    interface = RoundEnd(0, (), 0, RAW)
    record = window.row(StepOutcome(batch, result, interface, 1.5), facts(1, 1, busy=1.0), start + 4.0)
    row = record.row
    assert record.interface == RAW and not any(k.startswith("_") for k in row)  # carried beside the row
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
    assert row["wait_s"]["learner"] == 1.5 and row["groups_generated"] == 1

    window.add_filtered(Group([traj("g2", 0.0), traj("g2", 0.0)]))
    row = window.row(StepOutcome([], None, interface, 0.0), facts(2, 1, busy=3.0), start + 8.0).row
    assert row["skipped"] and row["trained_groups"] == 0 and row["filtered_groups"] == 1 and row["loss"] is None
    assert row["tokens_per_s_per_device"] == 0.0 and row["groups_generated"] == 1  # the filtered group
    assert row["idle_ratio"]["generator"] == 0.5  # 2 busy seconds of the 4-second window


def test_generation_figures_belong_to_the_step_that_decided_the_group_whatever_the_report_order():
    """A report landing after its group trained (or before the group decided) counts in the deciding step."""
    window = StepWindow("sync", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    result = step_result(sequence_tokens=24, seconds=1.0)
    window.add_report(report("g2", generated=40))  # an early report: g2 is decided in step 2
    g1 = Group([traj("g1", 1.0), traj("g1", 0.0)])
    window.decide("trained", g1)
    assert window.awaiting_reports() == ["g1"]  # the driver settles it before the row
    window.add_report(report("g1", generated=8))
    row = window.row(StepOutcome([g1], result, interface, 1.0), facts(1, 1, 1.0), window.started + 2.0).row
    assert row["groups_generated"] == 1 and row["gen_tokens_per_s"] == 8 / 2.0
    g2 = Group([traj("g2", 1.0), traj("g2", 0.0)])
    window.decide("trained", g2)
    row = window.row(StepOutcome([g2], result, interface, 1.0), facts(2, 2, 2.0), window.started + 2.0).row
    assert row["groups_generated"] == 1 and row["gen_tokens_per_s"] == 40 / 2.0


def fault(t: Trajectory, kind: str = "generation_error") -> Trajectory:
    return replace(t, infra_fault=InfraFault(kind, "boom"))


def test_infra_faults_are_counted_by_kind_and_never_enter_a_reward_figure():
    window = StepWindow("async", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    good, bad = traj("g1", 1.0), fault(traj("g1", 0.0), "env_error")
    trained = Group([good, stand_in(good, bad)], faulted=(bad,))
    window.decide("trained", trained)
    window.decide("infra_failed", Group([traj("g2", 1.0)], faulted=(fault(traj("g2", 0.0)), fault(traj("g2", 0.0)))))
    row = window.row(
        StepOutcome([trained], step_result(sequence_tokens=9, seconds=1.0), interface, 1.0),
        facts(1, 1, 1.0, generated=5 * 4),
        window.started + 1.0,
    ).row
    assert row["reward_mean"] == 1.0 and row["trained_reward_mean"] == 1.0  # the faulted 0 is not the policy's
    assert row["infra_failures"] == {
        "generation_error": 2,
        "engine_rejected": 0,
        "deadline": 0,
        "env_error": 1,
        "chat_template": 0,
    }
    assert row["infra_failures_total"] == 3 and row["episodes_played"] == 5 and row["fault_reissued_groups"] == 1
    # 4 generated tokens per trajectory: 1 trained, 1 faulted in the trained group, 3 in the re-issued one
    assert row["tokens"]["trained"] == 4 and row["tokens"]["infra_failed"] == 16 and row["tokens"]["generated"] == 20


def test_the_token_books_add_up_and_close_with_what_the_end_left_open():
    window = StepWindow("async", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    g1 = Group([traj("g1", 1.0), traj("g1", 0.0)])
    window.decide("trained", g1)
    window.decide("filtered", Group([traj("g2", 0.0), traj("g2", 0.0)]))
    window.decide("stale_dropped", Group([traj("g3", 1.0), traj("g3", 0.0)]))
    row = window.row(StepOutcome([g1], step_result(sequence_tokens=9), interface, 1.0), facts(1, 1, 1.0, 24), 1.0).row
    assert "tokens_run" not in row
    window.add_report(report("g5", generated=8))  # finished, its trajectories still on the way
    g4 = Group([traj("g4", 1.0), traj("g4", 0.0)])
    window.decide("trained", g4)
    end = facts(2, 2, 2.0, generated=24 + 8 + 3 + 5 + 8, lost=3)
    row = window.row(StepOutcome([g4], step_result(sequence_tokens=9), interface, 1.0), end, 2.0, {"g6": 5}).row
    books = row["tokens_run"]
    assert (books["trained"], books["filtered"], books["stale_dropped"], books["lost"]) == (16, 8, 8, 3)
    assert books["in_flight_end"] == 8 + 5 and books["attributed"] == books["generated"] == 48
    assert books["unattributed"] == 0 and row["tokens"]["generated"] == 48 - 24
    assert sum_token_books([{"tokens_run": books}, {}, {"tokens_run": books}])["generated"] == 96


def test_a_row_without_the_generators_count_leaves_its_tokens_to_the_next_rows():
    window = StepWindow("async", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    rows = []
    for step, count in [(1, 10), (2, None), (3, 45)]:  # step 2: a replica did not answer (restarting)
        window.decide("filtered", Group([traj(f"g{step}", 0.0), traj(f"g{step}", 0.0)]))
        rows.append(window.row(StepOutcome([], None, interface, 0.0), facts(step, 0, 1.0, count), float(step)).row)
    assert [r["tokens"]["generated"] for r in rows] == [10, None, 35]  # the rows add up to the run's 45


def test_a_report_later_than_its_groups_row_is_not_counted_in_flight_at_the_end():
    window = StepWindow("async", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    g1 = Group([traj("g1", 1.0), traj("g1", 0.0)])
    window.decide("trained", g1)  # its report did not come in time (the settle timed out)
    window.row(StepOutcome([g1], step_result(sequence_tokens=9), interface, 1.0), facts(1, 1, 1.0, 8), 1.0)
    window.add_report(report("g1", generated=8))  # late: g1's tokens are already in trained
    window.decide("filtered", Group([traj("g2", 0.0), traj("g2", 0.0)]))
    row = window.row(StepOutcome([], None, interface, 0.0), facts(2, 1, 1.0, 16), 2.0, {}).row
    books = row["tokens_run"]
    assert (books["trained"], books["filtered"], books["in_flight_end"], books["unattributed"]) == (8, 8, 0, 0)


def test_an_episode_with_tokens_of_two_versions_is_counted_mixed():
    """mixed_version_episodes: an update landed mid-episode (trainer.episode_version=latest); pinned
    episodes keep it at 0. An empty span (a turn that generated nothing) names no policy."""
    from seal.run.step_metrics import token_staleness

    one = traj("g", 1.0, version=2)
    mixed = replace(traj("g", 0.0, version=1), segments=[Segment(8, 10, 1), Segment(10, 12, 2)])
    empty = replace(traj("g", 0.0, version=2), segments=[Segment(8, 8, 1), Segment(8, 12, 2)])
    out = token_staleness([one, mixed, empty], learner_version=3)
    assert out["mixed_version_episodes"] == 1 and out["token_staleness_max"] == 2
