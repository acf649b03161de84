"""Infra faults of groups that finished after the run's last step still reach the closing note
(issue 46 item 12): no step decides those groups, so no row's infra_failures holds them."""

from __future__ import annotations

from dataclasses import replace

from replay.control_messages import RoundEnd
from replay.queue import stand_in
from seal.run.step_metrics import StepOutcome, StepWindow
from seal.run.summary import infra_text
from tests.unit.learner.step_results import step_result
from tests.unit.seal.run.test_step_metrics import RAW, Group, facts, fault, report, traj


def test_faulted_episodes_of_groups_decided_after_the_last_step_are_in_the_closing_note():
    window = StepWindow("async", max_new_tokens=8, learner_world_size=1, generator_replicas=1, skipped_overlong=0)
    interface = RoundEnd(0, (), 0, RAW)
    good, bad = traj("g1", 1.0), fault(traj("g1", 0.0))
    g1 = Group([good, stand_in(good, bad)], faulted=(bad,))
    window.add_report(replace(report("g1"), faults=("", "generation_error")))
    window.decide("trained", g1)
    first = window.row(StepOutcome([g1], step_result(sequence_tokens=9), interface, 1.0), facts(1, 1, 1.0, 8), 1.0).row
    assert first["infra_failures_total"] == 1 and "infra_failures_end" not in first
    # The last step trains g2; g3 finished meanwhile with a fault of its own, waiting in the replay queue.
    window.add_report(replace(report("g3"), faults=("generation_error", "")))
    g2 = Group([traj("g2", 1.0), traj("g2", 0.0)])
    window.decide("trained", g2)
    end = facts(2, 2, 2.0, generated=8 + 8 + 8)
    last = window.row(StepOutcome([g2], step_result(sequence_tokens=9), interface, 1.0), end, 2.0, {"g3": 4}).row
    assert last["infra_failures_total"] == 0 and last["episodes_played"] == 2  # the step decided g2 alone
    assert last["infra_failures_end"]["generation_error"] == 1 and last["episodes_played_end"] == 2
    assert infra_text([first, last]).startswith(
        "2 of 6 episodes (33.3%) ended by the system, not scored (generation_error 2)"
    )
