"""The wasted-token ledger's arithmetic (replay/token_ledger.py): every token in one bucket, each
step's buckets handed out once and summed into the run's, the run's books against the generator's
own count, and that count kept across replica restarts and retirements."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replay.messages import InfraFault, Segment, Trajectory
from replay.queue import Group, stand_in
from replay.token_ledger import BUCKETS, GeneratorCount, TokenLedger, reached_gradient, run_totals


def traj(group: str, generated: int, index: int = 0) -> Trajectory:
    return Trajectory(
        task_id="t",
        category="base",
        env="toy",
        group_id=group,
        rollout_index=index,
        interface_version=0,
        token_ids=list(range(4 + generated)),
        loss_mask=[0] * 4 + [1] * generated,
        logprobs=[0.0] * 4 + [-0.5] * generated,
        prompt_length=4,
        segments=[Segment(4, 4 + generated, 0)],
        reward=0.0,
        success=False,
        progress=0.0,
        tags=[],
        labels=[],
        error_type=None,
        outcome="completed",
        num_tool_calls=0,
        num_steps=1,
    )


def test_a_group_goes_to_its_bucket_and_its_faulted_members_to_infra_failed():
    ledger = TokenLedger()
    good, bad = traj("g1", 5, 0), replace(traj("g1", 3, 1), infra_fault=InfraFault("generation_error", "boom"))
    ledger.add_group("trained", Group("g1", [good, stand_in(good, bad)], 0, 1.0, (bad,)))  # the stand-in made nothing
    ledger.add_group("filtered", Group("g2", [traj("g2", 7), traj("g2", 1, 1)], 0, 0.0))
    ledger.add("lost", 2)
    step = ledger.close_step()
    assert list(step) == list(BUCKETS)  # every bucket, zeros included
    assert (step["trained"], step["infra_failed"], step["filtered"], step["lost"]) == (5, 3, 8, 2)
    assert sum(step.values()) == 5 + 3 + 8 + 2
    assert ledger.close_step() == dict.fromkeys(BUCKETS, 0)  # a step's buckets are handed out once


def test_the_run_sums_its_steps_and_the_difference_from_the_generator_is_unattributed():
    ledger = TokenLedger()
    ledger.add("trained", 10)
    first = ledger.close_step()
    ledger.add("stale_dropped", 4)
    ledger.add("in_flight_end", 6)
    second = ledger.close_step()
    books = ledger.totals(generator_count=20)
    assert {b: books[b] for b in BUCKETS} == {b: first[b] + second[b] for b in BUCKETS}
    assert (books["attributed"], books["generated"], books["unattributed"]) == (20, 20, 0)
    assert ledger.totals(23)["unattributed"] == 3 and ledger.totals(None)["unattributed"] is None
    assert reached_gradient(books) == 0.5
    assert (
        reached_gradient(run_totals({"trained": 3, "filtered": 1}, None)) == 0.75
    )  # no engine count: of the attributed
    assert reached_gradient(run_totals({}, 0)) is None


def test_a_bucket_takes_a_known_name_and_a_count_of_zero_or_more():
    ledger = TokenLedger()
    with pytest.raises(ValueError, match="unknown token bucket 'wasted'"):
        ledger.add("wasted", 1)
    with pytest.raises(ValueError, match="a bucket takes a count >= 0"):
        ledger.add("lost", -1)


def test_the_generator_count_keeps_what_a_restarted_replica_had_counted():
    count = GeneratorCount()
    count.read({"gen-0": ("a", 100), "gen-1": ("b", 40)})
    assert count.total == 140
    count.read({"gen-0": ("a", 130)})  # gen-1 did not answer: its last reading stays
    assert count.total == 170
    # gen-0 crashed and Ray restarted it: the new process counts from 0; the old one's 130 stays in the run's count.
    count.read({"gen-0": ("c", 25), "gen-1": ("b", 60)})
    assert count.total == 130 + 25 + 60
    count.read({"gen-0": ("c", 30)})  # gen-1 retired: its final count stays
    assert count.total == 130 + 30 + 60


def test_a_count_that_goes_back_is_a_restart_even_without_an_instance_id():
    count = GeneratorCount()
    count.read({"gen-0": ("", 50)})
    count.read({"gen-0": ("", 20)})
    assert count.total == 70
