"""The soak report's figures (benchmarks/chaos/report.py) from recorded samples and rows."""

from __future__ import annotations

from benchmarks.chaos.report import fault_recovery, processes, token_books


def test_growth_is_a_slope_per_step_and_the_last_half_of_the_longest_life():
    # One learner process growing 10 KB a step for 40 steps; one env process flat but short-lived.
    samples = [
        {"t": 10.0 * i, "step": i, "pid": 7, "kind": "learner", "rss_kb": 1000 + 10 * i, "fds": 40, "threads": 20}
        for i in range(41)
    ] + [{"t": 10.0 * i, "step": i, "pid": 9, "kind": "env", "rss_kb": 500, "fds": 30, "threads": 10} for i in range(5)]
    got = processes(samples, end_t=400.0)
    learner = got["learner"]
    assert abs(learner["rss_kb"]["per_step"] - 10.0) < 1e-9 and learner["fds"]["per_step"] == 0
    assert learner["rss_last_half"]["from_kb"] == 1200 and learner["rss_last_half"]["to_kb"] == 1400
    assert abs(learner["rss_last_half"]["growth"] - 1 / 6) < 1e-9
    assert got["env"]["rss_kb"]["per_step"] is None  # lived 4 steps: no slope claimed
    assert "rss_last_half" not in got["env"]  # gone before the last half


def test_recovery_is_the_time_to_the_next_trained_step_and_books_add_closed_invocations():
    rows = [
        {"t": 5.0, "invocation": 0, "row": {"trained_groups": 1, "tokens": {"generated": 100}}},
        {"t": 30.0, "invocation": 1, "row": {"trained_groups": 0, "tokens": {"generated": 50}}},
        {"t": 42.0, "invocation": 1, "row": {"trained_groups": 1, "tokens_run": {"generated": 90, "unattributed": 0}}},
    ]
    got = fault_recovery([{"t": 10.0, "kind": "driver_kill"}, {"t": 50.0, "kind": "env_kill"}], rows)
    assert got["driver_kill"] == {"median_s": 32.0, "max_s": 32.0, "no_step_after": 0}
    assert got["env_kill"]["no_step_after"] == 1
    books = token_books(rows)
    assert books == {
        "closed_invocations": 1,
        "generated": 90,
        "unattributed": 0,
        "generated_in_invocations_a_fault_ended": 100,
    }
