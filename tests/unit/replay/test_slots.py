"""The task stream's books: admission bounds staleness, re-issues keep the
slot, and every slot reaches the learner exactly once whatever crashes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.slots import SlotLedger

TASKS = [f"t{i}" for i in range(5)]


def test_sync_admission_is_one_batch_per_acknowledged_version():
    ledger = SlotLedger(TASKS, n=4, groups_per_step=2, max_staleness=0, seed=0)
    jobs = [ledger.next_job(0), ledger.next_job(0)]
    assert ledger.next_job(0) is None  # the third group waits for version 1
    assert [j.task_id for j in jobs] == ["t0", "t1"] and jobs[0].n == 4
    for j in jobs:
        ledger.consumed(j.group_id)
    assert ledger.next_job(0) is None and ledger.next_job(1).slot == 2


def test_async_admission_runs_max_staleness_batches_ahead():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=2, seed=0)
    assert [ledger.next_job(0).slot for _ in range(3)] == [0, 1, 2] and ledger.next_job(0) is None


def test_a_crash_reissues_the_slot_under_a_new_group_id_and_new_seed():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=0, seed=7)
    job = ledger.next_job(0)
    retry = ledger.failed(job.group_id, crash=True)
    assert (retry.slot, retry.task_id, retry.attempt) == (0, "t0", 1) and retry.group_id != job.group_id
    assert retry.seed != job.seed
    again = ledger.next_job(0)
    assert again == retry and ledger.counters.reissued == 1
    with pytest.raises(RuntimeError, match="not in flight"):
        ledger.consumed(job.group_id)  # the abandoned group never counts


def test_a_task_that_keeps_failing_is_given_up_in_one_line_but_crashes_do_not_count(caplog):
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=0, seed=0, max_attempts=2)
    job = ledger.next_job(0)
    for _ in range(5):
        job = ledger.failed(job.group_id, crash=True)
        ledger.next_job(0)
    job = ledger.failed(job.group_id, error="env_error: RuntimeError: tool server down")
    ledger.next_job(0)
    assert ledger.failed(job.group_id, error="env_error: again") is None  # the second failure: given up
    assert ledger.counters.given_up == 1 and ledger.low == 1  # the slot is accounted for ...
    assert ledger.next_job(0).slot == 1  # ... and refilled
    (line,) = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert line == (
        "task t0 (slot 0) given up after 2 attempts failed for the system's reasons; "
        "first error: env_error: RuntimeError: tool server down"
    )


def test_more_slots_given_up_than_trained_stops_the_run():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=0, seed=0, max_attempts=1)
    assert ledger.failed(ledger.next_job(0).group_id, error="generation_error: x") is None
    with pytest.raises(RuntimeError, match="2 task slots given up against 0 trained: the system keeps failing"):
        ledger.failed(ledger.next_job(0).group_id, error="generation_error: x")


def test_jobs_carry_the_episode_deadline():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=0, seed=0, episode_deadline_s=30.0)
    job = ledger.next_job(0)
    assert job.episode_deadline_s == 30.0 and ledger.failed(job.group_id).episode_deadline_s == 30.0


def test_epoch_boundaries_and_dropped_slots_free_admission():
    ledger = SlotLedger(TASKS[:2], n=2, groups_per_step=1, max_staleness=0, seed=0)
    first = ledger.next_job(0)
    ledger.dropped(first.group_id)  # stale: lost, and one more slot is admitted
    second = ledger.next_job(0)
    assert second.slot == 1 and not ledger.starts_epoch(second)
    ledger.consumed(second.group_id)
    third = ledger.next_job(1)
    assert third.slot == 2 and ledger.starts_epoch(third) and third.task_id == "t0"


def test_resume_replays_in_flight_slots_and_skips_finished_ones():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=2, seed=0)
    jobs = [ledger.next_job(0) for _ in range(3)]
    ledger.consumed(jobs[0].group_id)
    ledger.consumed(jobs[2].group_id)  # slot 1 still in flight at the checkpoint
    state = ledger.state()
    resumed = SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=2, seed=0)
    resumed.restore(state, policy_version=2)
    assert [resumed.next_job(2).slot for _ in range(3)] == [1, 3, 4]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["dispatch", "crash", "consume", "filter", "ack"]), st.integers(0, 5)), max_size=80
    ),
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(0, 2),
)
def test_every_slot_reaches_the_learner_exactly_once(ops, groups_per_step, max_staleness, oversample):
    ledger = SlotLedger(
        TASKS, n=2, groups_per_step=groups_per_step, max_staleness=max_staleness, seed=0, oversample=oversample
    )
    version, consumed, filtered = 0, [], []
    for op, pick in ops:
        live = sorted(ledger.in_flight)
        if op == "dispatch":
            ledger.next_job(version)
        elif op == "ack":
            version += 1
        elif live:
            gid = live[pick % len(live)]
            if op == "crash":
                ledger.failed(gid, crash=True)
            elif op == "filter":
                filtered.append(ledger.filtered(gid))
            else:
                consumed.append(ledger.consumed(gid))
        # Admission never runs past the bound: staleness-derived, plus over-admission, plus one per filtered slot.
        assert ledger.next_slot <= (version + max_staleness + 1) * groups_per_step + oversample + len(filtered)
    assert len(consumed) == len(set(consumed)) and not set(consumed) & set(filtered)
    assert ledger.counters.consumed == len(consumed) and ledger.counters.filtered == len(filtered)
    # Nothing vanished: every slot handed out is consumed, filtered, in flight or waiting for a re-issue.
    pending = {j.slot for j in ledger.in_flight.values()} | {j.slot for j in ledger.retry}
    assert set(consumed) | set(filtered) | pending == set(range(ledger.next_slot))


def test_filtered_slots_are_refilled_and_oversample_admits_ahead():
    ledger = SlotLedger(TASKS, n=2, groups_per_step=2, max_staleness=0, seed=0, oversample=1)
    jobs = [ledger.next_job(0) for _ in range(3)]  # one batch of 2, plus 1 over-admitted
    assert all(jobs) and ledger.next_job(0) is None
    ledger.filtered(jobs[0].group_id)  # equal rewards: set aside, its place refilled
    refill = ledger.next_job(0)
    assert refill is not None and refill.slot == 3 and ledger.next_job(0) is None
    with pytest.raises(ValueError, match="oversample"):
        SlotLedger(TASKS, n=2, groups_per_step=1, max_staleness=0, seed=0, oversample=-1)
