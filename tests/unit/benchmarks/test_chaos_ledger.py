"""The soak's books (benchmarks/chaos/ledger.py, schedule.py): the lineage of steps across rewinds,
groups lost and trained twice, and the seeded schedule."""

from __future__ import annotations

from benchmarks.chaos.ledger import account, dropped_slots, given_up_slots, lineage
from benchmarks.chaos.schedule import KINDS, RUN_ENDING, one_each, random_schedule


def rec(inv: int, step: int, *slots: int, attempt: int = 0) -> dict:
    return {"invocation": inv, "step": step, "groups": [f"g{s:07d}a{attempt}" for s in slots]}


# Invocation 0 trains steps 1-4, checkpoints at 2, dies; invocation 1 resumes at 2, replays slots 2 and 3.
RUN = [rec(0, 1, 0), rec(0, 2, 1), rec(0, 3, 2), rec(0, 4, 3), rec(1, 3, 2), rec(1, 4, 3), rec(1, 5, 4)]
STARTS = {0: 0, 1: 2}


def test_a_rewind_discards_the_steps_after_the_checkpoint():
    kept = lineage(RUN, STARTS, final_step=5)
    assert [(r["invocation"], r["step"]) for r in kept] == [(0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]


def test_a_clean_lineage_has_nothing_lost_or_twice():
    got = account(RUN, STARTS, final_step=5, low=5, done=[], given_up=[])
    assert got["groups_trained"] == 5 and got["groups_trained_twice"] == [] and got["groups_lost"] == []
    assert got["discarded_steps"] == 2 and got["lineage_gaps"] == []


def test_a_slot_trained_in_two_standing_steps_is_trained_twice_and_a_missing_one_lost():
    twice = [*RUN[:2], rec(1, 3, 1), rec(1, 4, 3), rec(1, 5, 4)]  # slot 1 again, slot 2 never
    got = account(twice, STARTS, final_step=5, low=5, done=[], given_up=[])
    assert got["groups_trained_twice"] == [1] and got["groups_lost"] == [2]


def test_a_given_up_slot_is_accounted_and_a_trained_unfinished_one_is_named():
    run = [rec(0, 1, 0), rec(0, 2, 2, attempt=1), rec(0, 3, 7)]
    lines = ["task toy_1 (slot 1) given up after 5 attempts (first error: ...)"]
    got = account(run, {0: 0}, final_step=3, low=3, done=[], given_up=given_up_slots(lines))
    assert got["groups_lost"] == [] and got["groups_given_up"] == 1 and got["trained_not_finished"] == [7]


def test_the_schedule_is_the_seeds():
    a, b = random_schedule(47, 3600, 60), random_schedule(47, 3600, 60)
    assert a == b and a != random_schedule(48, 3600, 60) and all(0 < f.at_s < 3600 for f in a)
    assert 40 <= len(a) <= 80 and {f.kind for f in a} == set(KINDS)
    share = sum(f.kind in RUN_ENDING for f in a) / len(a)
    assert 0.1 < share < 0.35, share  # run-ending faults rarer: each costs a restart
    each = one_each(1, 15.0)
    assert sorted(f.kind for f in each) == sorted(KINDS) and [f.at_s for f in each] == [
        15.0 * (i + 1) for i in range(len(KINDS))
    ]


def test_a_steady_tail_draws_no_run_ending_fault_and_keeps_the_rest():
    plain, steady = random_schedule(47, 3600, 45), random_schedule(47, 3600, 45, steady_tail_s=1800)
    assert [f.at_s for f in plain] == [f.at_s for f in steady]  # the same times: only the tail's kinds differ
    tail = [f for f in steady if f.at_s >= 1800]
    assert tail and not any(f.kind in RUN_ENDING for f in tail)
    assert {f.kind for f in tail} == set(KINDS) - set(RUN_ENDING)
    assert [f for f in plain if f.at_s < 1800] == [f for f in steady if f.at_s < 1800]
    try:
        random_schedule(1, 600, 30, kinds=RUN_ENDING, steady_tail_s=60)
    except ValueError as exc:
        assert "survives in place" in str(exc)
    else:
        raise AssertionError("a tail with only run-ending kinds must be refused")


def test_a_slot_dropped_past_the_staleness_bound_is_accounted_not_lost():
    # Slots 0-7 finished (low 8); 6 was never trained: the run said it was dropped as stale.
    run = [rec(0, step, slot) for step, slot in enumerate([0, 1, 2, 3, 4, 5, 7], start=1)]
    lines = ["[0:03:24] group    g0000006a0 dropped (slot 6): staleness 2 past trainer.max_staleness 1; ..."]
    said = account(run, {0: 0}, final_step=7, low=8, done=[], given_up=[], dropped=dropped_slots(lines))
    assert said["groups_lost"] == [] and said["groups_dropped_stale"] == 1
    unsaid = account(run, {0: 0}, final_step=7, low=8, done=[], given_up=[])
    assert unsaid["groups_lost"] == [6] and unsaid["groups_dropped_stale"] == 0  # nothing said it: lost
