"""Wire messages and the replay queue."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.control_messages import Control
from replay.messages import SCHEMA_VERSION, InfraFault, Segment, Trajectory
from replay.queue import ReplayQueue
from replay.wire import WireError, decode, encode


def traj(group="g0", index=0, version=0, reward=1.0, n_tokens=12) -> Trajectory:
    gen = n_tokens // 3
    ids = list(range(1000, 1000 + n_tokens))
    mask = [0] * (n_tokens - gen) + [1] * gen
    logprobs = [0.0] * (n_tokens - gen) + [-0.5] * gen
    return Trajectory(
        task_id="multi_turn_base_1",
        category="base",
        env="bfcl",
        group_id=group,
        rollout_index=index,
        interface_version=2,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=n_tokens - gen,
        segments=[Segment(n_tokens - gen, n_tokens, version)],
        reward=reward,
        success=bool(reward),
        progress=1.0,
        tags=["pass"],
        labels=["pass"],
        error_type=None,
        outcome="completed",
        num_tool_calls=1,
        num_steps=1,
        timings={"total_s": 0.1},
    )


@pytest.mark.parametrize(
    "message",
    [
        traj(),
        replace(traj(), infra_fault=InfraFault("engine_rejected", "ValueError: prompt longer than the model")),
        replace(traj(), reference_logprobs=[0.0] * 8 + [-0.25] * 4),  # exact in float32
        Control("scale", {"env": 6}),
    ],
)
def test_every_message_round_trips(message):
    assert decode(encode(message)) == message


def test_token_arrays_travel_as_raw_bytes():
    t = traj(n_tokens=3000)
    frame = msgpack.unpackb(encode(t), raw=False)
    assert isinstance(frame["body"]["token_ids"], bytes) and len(frame["body"]["token_ids"]) == 4 * 3000
    assert len(encode(t)) < len(msgpack.packb(t.to_dict()))


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2]), "map with keys"),
        (msgpack.packb({"v": 99, "kind": "control", "body": {"command": "x"}}), "schema version"),
        (msgpack.packb({"v": SCHEMA_VERSION, "kind": "nope", "body": {}}), "unknown message kind"),
        (msgpack.packb({"v": SCHEMA_VERSION, "kind": "control", "body": {"cmd": "x"}}), "bad control body"),
    ],
)
def test_malformed_frames_are_rejected_with_a_reason(frame, reason):
    with pytest.raises(WireError, match=reason):
        decode(frame)


def test_inconsistent_trajectory_is_rejected():
    frame = msgpack.unpackb(encode(traj()), raw=False)
    frame["body"]["loss_mask"] = bytes(len(frame["body"]["loss_mask"]))  # mask no longer matches the segments
    with pytest.raises(WireError, match="loss mask"):
        decode(msgpack.packb(frame, use_bin_type=True))
    frame = msgpack.unpackb(encode(traj()), raw=False)
    frame["body"]["logprobs"] = b"\x00\x01\x02"
    with pytest.raises(WireError, match="logprobs"):
        decode(msgpack.packb(frame, use_bin_type=True))


def test_a_carried_reference_travels_as_raw_bytes_and_is_checked():
    t = replace(traj(), reference_logprobs=[0.0] * 8 + [-0.25] * 4)
    frame = msgpack.unpackb(encode(t), raw=False)
    assert isinstance(frame["body"]["reference_logprobs"], bytes) and len(frame["body"]["reference_logprobs"]) == 4 * 12
    assert msgpack.unpackb(encode(traj()), raw=False)["body"]["reference_logprobs"] is None
    frame["body"]["reference_logprobs"] = b"\x00\x01"
    with pytest.raises(WireError, match="reference_logprobs must be raw"):
        decode(msgpack.packb(frame, use_bin_type=True))
    with pytest.raises(ValueError, match="11 reference logprobs for 12 tokens"):
        replace(traj(), reference_logprobs=[0.0] * 11).validate()
    with pytest.raises(ValueError, match="reference logprobs set on masked tokens"):
        replace(traj(), reference_logprobs=[-1.0] * 12).validate()
    # A record written before the field existed reads as carrying none.
    d = traj().to_dict()
    del d["reference_logprobs"]
    assert Trajectory.from_dict(d).reference_logprobs is None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_only_ever_raise_wire_error(data):
    try:
        decode(data)
    except WireError:
        pass


def test_groups_complete_in_any_order_and_duplicates_are_ignored():
    q = ReplayQueue(group_size=3, groups_per_batch=1, reissue_after_s=900.0)
    assert q.add(traj("a", 2)) and q.add(traj("a", 0))
    assert not q.add(traj("a", 0))  # duplicate
    assert q.take_batch() is None
    q.add(traj("a", 1))
    (group,) = q.take_batch()
    assert [t.rollout_index for t in group.trajectories] == [0, 1, 2] and group.weight == 1.0
    assert not q.add(traj("a", 1))  # late duplicate of a delivered group
    assert q.stats.duplicates == 2 and q.stats.accepted == 3


def test_staleness_bound_drops_or_downweights():
    q = ReplayQueue(group_size=1, groups_per_batch=1, max_staleness=1, reissue_after_s=900.0)
    q.add(traj("old", 0, version=0))
    q.add(traj("new", 0, version=2))
    q.set_policy_version(3)
    (group,) = q.take_batch()
    assert group.group_id == "new" and group.staleness == 1 and q.stats.dropped_stale == 1
    d = ReplayQueue(group_size=1, groups_per_batch=1, max_staleness=1, stale_policy="downweight", reissue_after_s=900.0)
    d.add(traj("old", 0, version=0))
    d.set_policy_version(3)
    (group,) = d.take_batch()
    assert group.staleness == 3 and group.weight == 0.25 and d.stats.downweighted == 1


def test_incomplete_groups_are_reissued_once_and_late_rollouts_ignored():
    now = [0.0]
    q = ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=10, clock=lambda: now[0])
    q.add(traj("slow", 0))
    now[0] = 9.0
    assert q.expired() == []
    now[0] = 10.0
    assert q.expired() == [("slow", "multi_turn_base_1")] and q.stats.reissued == 1
    assert not q.add(traj("slow", 1))  # the old attempt's straggler
    assert q.take_batch() is None


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), groups=st.integers(1, 6), n=st.integers(1, 4), dup_rate=st.floats(0, 0.5))
def test_every_group_reaches_the_learner_exactly_once(seed, groups, n, dup_rate):
    rng = random.Random(seed)
    deliveries = [traj(f"g{g}", i) for g in range(groups) for i in range(n)]
    deliveries += [t for t in deliveries if rng.random() < dup_rate]
    rng.shuffle(deliveries)
    q = ReplayQueue(group_size=n, groups_per_batch=1, reissue_after_s=900.0)
    seen = []
    for t in deliveries:
        q.add(t)
        while (batch := q.take_batch()) is not None:
            seen.extend(g.group_id for g in batch)
    assert sorted(seen) == sorted(f"g{g}" for g in range(groups))


def test_zero_variance_groups_are_set_aside_and_never_batched():
    q = ReplayQueue(group_size=2, groups_per_batch=1, filter_groups="zero_variance", reissue_after_s=900.0)
    for i in range(2):
        q.add(traj("flat", i, reward=0.0))
    assert q.take_batch() is None and q.stats.filtered == 1
    (flat,) = q.drain_filtered()
    assert flat.group_id == "flat" and [t.reward for t in flat.trajectories] == [0.0, 0.0] and q.drain_filtered() == []
    q.add(traj("flat", 0, reward=1.0))  # a late duplicate of a filtered group is still a duplicate
    assert q.stats.duplicates == 1
    q.add(traj("mixed", 0, reward=1.0))
    q.add(traj("mixed", 1, reward=0.0))
    assert [g.group_id for g in q.take_batch()] == ["mixed"]


def test_no_filter_keeps_every_group_and_partial_takes_what_is_ready():
    q = ReplayQueue(group_size=2, groups_per_batch=2, reissue_after_s=900.0)
    for i in range(2):
        q.add(traj("flat", i, reward=0.0))
    assert q.take_batch() is None and q.stats.filtered == 0
    assert [g.group_id for g in q.take_batch(partial=True)] == ["flat"]
    assert q.take_batch(partial=True) is None  # nothing ready: still None
    with pytest.raises(ValueError, match="filter_groups"):
        ReplayQueue(group_size=2, groups_per_batch=1, filter_groups="dapo", reissue_after_s=900.0)


def test_the_infra_fault_is_typed_on_the_wire_and_an_unknown_kind_is_refused():
    faulted = replace(traj(), infra_fault=InfraFault("deadline", "past its wall-clock deadline"))
    body = msgpack.unpackb(encode(faulted), raw=False)["body"]
    assert body["infra_fault"] == {"kind": "deadline", "message": "past its wall-clock deadline"}
    assert decode(encode(faulted)).error == "deadline: past its wall-clock deadline" and traj().error is None
    assert Trajectory.from_dict(faulted.to_dict()) == faulted
    body["infra_fault"]["kind"] = "policy_was_bad"
    frame = msgpack.packb({"v": SCHEMA_VERSION, "kind": "trajectory", "body": body}, use_bin_type=True)
    with pytest.raises(WireError, match="infra fault kind 'policy_was_bad'"):
        decode(frame)


def fault(t: Trajectory, kind: str = "generation_error") -> Trajectory:
    return replace(t, infra_fault=InfraFault(kind, "boom"))


def test_faulted_members_leave_the_statistics_and_a_short_group_is_handed_back():
    q = ReplayQueue(
        group_size=4, groups_per_batch=1, min_group_size=3, filter_groups="zero_variance", reissue_after_s=900.0
    )
    # one fault: three members left, enough; rewards 1 1 0 among them (the fault's 0 is not counted)
    for i, r in enumerate((1.0, 1.0, 0.0)):
        q.add(traj("ok", i, reward=r))
    q.add(fault(traj("ok", 3, reward=0.0)))
    (group,) = q.take_batch()
    assert [t.rollout_index for t in group.trajectories] == [0, 1, 2, 3] and group.trajectories[3].padding
    assert group.trajectories[3].num_generated_tokens == 0 and group.trajectories[3].infra_fault is None
    assert [t.rollout_index for t in group.members] == [0, 1, 2] and [t.rollout_index for t in group.faulted] == [3]
    # two faults: two left, fewer than 3: handed back for re-issue, never batched
    for i in range(4):
        q.add(fault(traj("short", i)) if i < 2 else traj("short", i, reward=float(i % 2)))
    assert q.take_batch() is None and [g.group_id for g in q.drain_faulted()] == ["short"] and q.drain_faulted() == []
    # one fault whose removal leaves equal rewards: the filter judges the members the policy played
    for i in range(3):
        q.add(traj("flat", i, reward=1.0))
    q.add(fault(traj("flat", 3, reward=0.0)))
    assert [g.group_id for g in q.drain_filtered()] == ["flat"]
    assert (q.stats.infra_failed, q.stats.fault_reissued, q.stats.filtered) == (4, 1, 1)


def test_every_generated_token_of_the_queue_is_decided_lost_or_undecided():
    now = [0.0]
    q = ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=10, clock=lambda: now[0])
    q.add(traj("late", 0))
    now[0] = 10.0
    assert [gid for gid, _ in q.expired()] == ["late"] and q.stats.lost_tokens == 4
    q.add(traj("late", 1))  # the straggler of a group given up
    assert q.stats.lost_tokens == 8
    q.add(traj("open", 0))
    q.add(traj("done", 0))
    q.add(traj("done", 1))
    assert q.undecided_tokens() == {"open": 4, "done": 8}
    q.abandon("open")
    assert q.stats.lost_tokens == 12 and q.undecided_tokens() == {"done": 8}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_rollout_with_a_non_finite_logprob_is_refused_before_the_learner(value, caplog):
    """Issue 46 item 5: one NaN behaviour logprob from a broken replica, trained on, makes the weights
    NaN for good (clamp keeps NaN; NaN x mask 0 is NaN). It is made a generation_error as it arrives."""
    q = ReplayQueue(group_size=3, groups_per_batch=1, min_group_size=2, reissue_after_s=900.0)
    broken = traj("g", 2, reward=1.0)
    broken = replace(broken, logprobs=[*broken.logprobs[:-1], value])
    for t in (traj("g", 0, reward=0.0), traj("g", 1, reward=1.0), broken):
        q.add(t)
    (group,) = q.take_batch()
    assert [t.rollout_index for t in group.faulted] == [2] and group.faulted[0].infra_fault.kind == "generation_error"
    assert group.trajectories[2].padding and all(math.isfinite(lp) for t in group.trajectories for lp in t.logprobs)
    assert q.stats.nonfinite_refused == 1 and q.stats.infra_failed == 1
    assert f"behaviour logprob {value} at token 11: refused" in caplog.text
    # too few members left: the group is handed back for re-issue, as for any other fault
    for i in range(3):
        t = traj("h", i)
        q.add(replace(t, logprobs=[*t.logprobs[:-1], value]) if i else t)
    assert [g.group_id for g in q.drain_faulted()] == ["h"] and q.stats.nonfinite_refused == 3
