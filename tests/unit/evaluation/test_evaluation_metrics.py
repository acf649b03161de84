"""evaluation.metrics against a small case computed by hand.

Three snapshots (A_0 step 0, A_1 step 10, final step 20), two views
(validation, replay), two categories of unequal size (base: b1..b4,
miss_param: m1, m2) so macro and micro differ. Final did not run m2 on replay,
so its churn denominators are 5 tasks, not 6.

              validation            replay
             b1 b2 b3 b4 m1 m2    b1 b2 b3 b4 m1 m2
    A_0       1  0  0  0  0  0     1  1  1  0  1  0
    A_1       1  1  0  0  1  0     1  0  1  1  0  0
    final     1  1  1  1  0  0     0  0  1  1  1  -
"""

from __future__ import annotations

import json

import pytest

from evaluation.metrics import (
    best_validation,
    churn,
    classify_process,
    fix_forget_vs_base,
    forgetting,
    summarize,
    view_success,
)
from evaluation.records import SnapshotInfo, TaskResult, read_task_csv, write_task_csv

TASKS = ("b1", "b2", "b3", "b4", "m1", "m2")
TABLE = {
    ("A_0", "validation"): "100000",
    ("A_1", "validation"): "110010",
    ("final", "validation"): "111100",
    ("A_0", "replay"): "111010",
    ("A_1", "replay"): "101100",
    ("final", "replay"): "00111-",
}
GEN = {"A_0": 10, "A_1": 20, "final": 30}  # generated tokens per task
CALLS = {"A_0": 1, "A_1": 2, "final": 3}
SPECIAL = {  # (snapshot, view, task) -> (process_error, outcome)
    ("A_1", "replay", "b2"): ("timeout after 600 s", "aborted"),
    ("A_1", "replay", "m1"): ("crash: worker died", "aborted"),
    ("final", "validation", "m2"): (None, "context_overflow"),
}
SNAPSHOTS = [  # deliberately out of order: summarize orders by step
    SnapshotInfo("final", step=20, policy_version=20, interface_version=3, wall_s=250.0, update_tokens=15000),
    SnapshotInfo("A_0", step=0, policy_version=0, interface_version=0),
    SnapshotInfo("A_1", step=10, policy_version=10, interface_version=1, wall_s=100.0, update_tokens=5000),
]


def make_results() -> list[TaskResult]:
    out = []
    for (snap, view), row in TABLE.items():
        for task, cell in zip(TASKS, row):
            if cell == "-":
                continue
            error, outcome = SPECIAL.get((snap, view, task), (None, "completed"))
            out.append(
                TaskResult(
                    snap,
                    view,
                    task,
                    "base" if task.startswith("b") else "miss_param",
                    cell == "1",
                    float(cell == "1"),
                    CALLS[snap],
                    GEN[snap],
                    100,
                    1.0,
                    error,
                    outcome,
                )
            )
    return out


@pytest.fixture(scope="module")
def summary():
    return summarize(make_results(), SNAPSHOTS)


def test_shape_is_json_and_snapshots_are_in_step_order(summary):
    assert summary["snapshots"] == ["A_0", "A_1", "final"]
    for key in (
        "success",
        "uvg_prev",
        "uvg_base",
        "forget_rate",
        "fix_rate",
        "cost",
        "best_validation",
        "delta_fix",
        "delta_forget",
        "forgetting",
        "id_gain",
        "ood_gain",
        "diagnostics",
    ):
        assert key in summary
    assert json.loads(json.dumps(summary)) == summary


def test_success_macro_and_micro(summary):
    s = summary["success"]
    assert s["A_0"]["validation"]["by_category"] == {"base": 0.25, "miss_param": 0.0}
    assert s["A_0"]["validation"]["overall"] == pytest.approx(0.125)
    assert s["A_0"]["validation"]["micro"] == pytest.approx(1 / 6)
    assert s["final"]["validation"]["overall"] == pytest.approx(0.5)  # (1.0 + 0.0) / 2
    assert s["final"]["validation"]["micro"] == pytest.approx(4 / 6)
    assert s["A_1"]["replay"]["overall"] == pytest.approx(0.375)  # (0.75 + 0) / 2, process errors not folded in
    assert s["final"]["replay"]["by_category"] == {"base": 0.5, "miss_param": 1.0}
    assert s["final"]["replay"]["overall"] == pytest.approx(0.75)
    assert s["final"]["replay"]["micro"] == pytest.approx(3 / 5)
    assert s["final"]["replay"]["n_by_category"] == {"base": 4, "miss_param": 1}


def test_update_validation_gains(summary):
    assert summary["uvg_prev"] == pytest.approx({"A_1": 0.375, "final": 0.0})
    assert summary["uvg_base"] == pytest.approx({"A_1": 0.375, "final": 0.375})


def test_best_validation_tie_goes_to_earliest(summary):
    # A_1 and final both score 0.5 macro on validation.
    assert summary["best_validation"] == "A_1"
    assert summary["final"] == "final"
    assert best_validation([0.2, 0.7, 0.7], ["a", "b", "c"]) == "b"
    assert best_validation([None, 0.1, 0.3], ["a", "b", "c"]) == "c"
    assert best_validation([None, None], ["a", "b"]) is None


def test_forgetting_counts_only_replay_drops(summary):
    assert summary["forgetting"] == pytest.approx({"A_1": 0.25, "final": 0.0})  # .625 -> .375 -> .75
    assert forgetting([0.5, None, 0.4], ["a", "b", "c"]) == {"b": None, "c": None}


def test_adjacent_churn(summary):
    fix, forget = summary["delta_fix"], summary["delta_forget"]
    # replay A_0 -> A_1 over 6 shared: fixed b4; forgot b2, m1
    assert fix["A_1"]["replay"] == pytest.approx(1 / 6) and forget["A_1"]["replay"] == pytest.approx(2 / 6)
    # replay A_1 -> final over 5 shared (m2 missing): fixed m1; forgot b1
    assert fix["final"]["replay"] == pytest.approx(1 / 5) and forget["final"]["replay"] == pytest.approx(1 / 5)
    # validation: A_0 -> A_1 fixed b2, m1; A_1 -> final fixed b3, b4, forgot m1
    assert fix["A_1"]["validation"] == pytest.approx(2 / 6) and forget["A_1"]["validation"] == 0.0
    assert fix["final"]["validation"] == pytest.approx(2 / 6) and forget["final"]["validation"] == pytest.approx(1 / 6)
    assert "A_0" not in fix


def test_fix_and_forget_against_base(summary):
    fix, forget = summary["fix_rate"], summary["forget_rate"]
    # replay: A_0 failed {b4, m2}, A_1 solves b4; A_0 solved {b1,b2,b3,m1}, A_1 fails b2, m1
    assert fix["A_1"]["replay"] == pytest.approx(0.5) and forget["A_1"]["replay"] == pytest.approx(0.5)
    # final lacks m2: failed {b4} -> solved; solved {b1,b2,b3,m1} -> fails b1, b2
    assert fix["final"]["replay"] == pytest.approx(1.0) and forget["final"]["replay"] == pytest.approx(0.5)
    # validation: A_0 failed 5 tasks, solved only b1 (kept by everyone)
    assert fix["A_1"]["validation"] == pytest.approx(2 / 5) and forget["A_1"]["validation"] == 0.0
    assert fix["final"]["validation"] == pytest.approx(3 / 5) and forget["final"]["validation"] == 0.0


def test_empty_denominators_are_none_not_zero():
    assert fix_forget_vs_base({"a": True, "b": True}, {"a": False, "b": True}) == (None, 0.5)
    assert fix_forget_vs_base({"a": False}, {"a": True}) == (1.0, None)
    assert fix_forget_vs_base({"a": True}, {"b": True}) == (None, None)  # nothing shared
    assert churn({"a": True}, {"b": False}) == (None, None)


def test_gains_need_their_views(summary):
    assert summary["id_gain"] is None and summary["ood_gain"] is None  # neither view was run
    rows = [
        TaskResult(s, v, "t1", "base", ok, float(ok), 0, 0, 0, 0.0)
        for s, v, ok in (("A_0", "id", False), ("final", "id", True), ("A_0", "ood", True), ("final", "ood", False))
    ]
    out = summarize(rows, [SnapshotInfo("A_0", 0, 0, 0), SnapshotInfo("final", 5, 5, 2, update_tokens=50)])
    assert out["id_gain"] == 1.0 and out["ood_gain"] == -1.0
    assert out["uvg_prev"] == {"final": None}  # no validation view
    assert out["best_validation"] is None


def test_cost(summary):
    c = summary["cost"]
    assert c["A_0"]["tasks"] == 12 and c["A_0"]["rollout_tokens_per_task"] == 110.0
    assert c["A_0"]["updates"] == 0 and c["A_0"]["update_tokens_per_update"] is None
    assert c["A_1"]["tool_calls"] == 24 and c["A_1"]["tool_calls_per_task"] == 2.0
    assert c["A_1"]["update_tokens_per_update"] == 500.0 and c["A_1"]["train_wall_s"] == 100.0
    assert c["final"]["tasks"] == 11 and c["final"]["generated_tokens_per_task"] == 30.0
    assert c["final"]["tool_calls"] == 33 and c["final"]["eval_wall_s"] == 11.0
    assert c["final"]["update_tokens"] == 10000 and c["final"]["update_tokens_per_update"] == 1000.0
    assert c["final"]["train_wall_s"] == 150.0 and c["final"]["train_wall_s_total"] == 250.0


def test_diagnostics_are_counted_apart(summary):
    d = summary["diagnostics"]["A_1"]["replay"]
    assert (d["timeout"], d["crash"], d["aborted"], d["process_errors"], d["failed_with_process_error"]) == (
        1,
        1,
        0,
        2,
        2,
    )
    # without b2, m1: base {b1,b3,b4} all solved, miss_param {m2} failed
    assert d["overall_excluding_process_errors"] == pytest.approx(0.5)
    assert summary["diagnostics"]["final"]["validation"]["context_overflow"] == 1
    assert summary["diagnostics"]["A_0"]["replay"]["process_errors"] == 0
    t = TaskResult("s", "v", "t", "c", False, 0.0, 0, 0, 0, 0.0, None, "aborted")
    assert classify_process(t) == ["aborted"]
    assert classify_process(TaskResult("s", "v", "t", "c", False, 0.0, 0, 0, 0, 0.0, "Timed out", "completed")) == [
        "timeout"
    ]


def test_bad_inputs_fail_loudly():
    r = TaskResult("A_0", "replay", "t1", "base", True, 1.0, 0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="twice"):
        summarize([r, r], [SnapshotInfo("A_0", 0, 0, 0)])
    with pytest.raises(ValueError, match="without a SnapshotInfo"):
        summarize([r], [SnapshotInfo("A_1", 0, 0, 0)])
    with pytest.raises(ValueError, match="duplicate"):
        summarize([], [SnapshotInfo("A_0", 0, 0, 0), SnapshotInfo("A_0", 1, 1, 0)])
    with pytest.raises(ValueError):
        view_success([])


def test_records_round_trip(tmp_path):
    results = make_results()
    assert read_task_csv(write_task_csv(results, tmp_path / "r.csv")) == results
    assert TaskResult.from_dict(results[0].to_dict()) == results[0]
    assert SnapshotInfo.from_dict(SNAPSHOTS[0].to_dict()) == SNAPSHOTS[0]
    assert TaskResult.from_dict({**results[0].to_dict(), "success": "False"}).success is False
    with pytest.raises(ValueError, match="unknown"):
        SnapshotInfo.from_dict({**SNAPSHOTS[0].to_dict(), "stepp": 3})
    with pytest.raises(ValueError):
        TaskResult.from_dict({**results[0].to_dict(), "success": "maybe"})
