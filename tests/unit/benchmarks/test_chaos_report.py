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
    # Each end is the median of 3 minutes of samples (t 200-380 and 220-400 of the tail from 200).
    assert learner["rss_tail"]["from_kb"] == 1290 and learner["rss_tail"]["to_kb"] == 1310
    assert abs(learner["rss_tail"]["growth"] - (1310 / 1290 - 1)) < 1e-9
    assert "settled" not in learner["rss_tail"]  # the process is younger than WARM_S
    assert got["env"]["rss_kb"]["per_step"] is None  # lived 4 steps: no slope claimed
    assert "rss_tail" not in got["env"]  # gone before the last half


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


def test_the_tail_window_starts_where_the_soak_said_and_takes_the_longest_life_in_it():
    # Two learner processes: the first lives to t=250, the second from t=200 on; the tail starts at 240.
    first = [
        {"t": 10.0 * i, "step": i, "pid": 3, "kind": "learner", "rss_kb": 900, "fds": 1, "threads": 1}
        for i in range(26)
    ]
    second = [
        {
            "t": 200.0 + 10 * i,
            "step": 20 + i,
            "pid": 8,
            "kind": "learner",
            "rss_kb": 1000 + (50 if i == 5 else 0),
            "fds": 1,
            "threads": 1,
        }
        for i in range(21)
    ]
    tail = processes(first + second, end_t=400.0, tail_from_t=240.0)["learner"]["rss_tail"]
    assert tail["pid"] == 8 and tail["from_s"] == 240.0 and tail["minutes"] == round(160 / 60, 1)
    assert tail["growth"] == 0.0 and tail["max_kb"] == 1050  # a passing peak shows in max, not in growth


def test_settled_growth_leaves_out_a_process_s_first_minutes():
    # RSS climbs for the first 10 minutes (start-up), then stays flat for 20: settled growth is 0.
    v = [
        {
            "t": 30.0 * i,
            "step": i,
            "pid": 5,
            "kind": "learner",
            "rss_kb": 1000 + 20 * min(i, 20),
            "fds": 1,
            "threads": 1,
        }
        for i in range(61)
    ]
    tail = processes(v, end_t=1800.0, tail_from_t=0.0)["learner"]["rss_tail"]
    assert tail["growth"] > 0.3 and tail["settled"]["growth"] == 0.0 and tail["settled"]["minutes"] == 20.0


def test_the_floor_is_what_a_process_keeps_between_its_steps():
    # A learner's RSS swings by a step's activations; samples land at random points of a step. The
    # floor (least reading at either end) stays flat while the medians follow where samples fell.
    swing = [0, 400, 0, 400, 0, 400, 400, 400, 0, 400]  # early samples mostly between steps
    swing += [400] * 8 + [0, 400]  # late ones mostly mid-step
    v = [
        {"t": 700.0 + 90 * i, "step": i, "pid": 5, "kind": "learner", "rss_kb": 1000 + x, "fds": 1, "threads": 1}
        for i, x in enumerate(swing)
    ]
    tail = processes(v, end_t=v[-1]["t"], tail_from_t=0.0)["learner"]["rss_tail"]
    assert tail["growth"] > 0.3 and tail["floor_growth"] == 0.0
    leak = [{**x, "rss_kb": x["rss_kb"] + 5 * x["step"]} for x in v]  # 5 KB kept every step: the floor rises
    assert processes(leak, end_t=v[-1]["t"], tail_from_t=0.0)["learner"]["rss_tail"]["floor_growth"] > 0
