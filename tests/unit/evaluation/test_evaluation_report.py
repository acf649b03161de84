"""evaluation.report: report.md, plots, CSV and JSON from a small synthetic run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from evaluation.metrics import summarize
from evaluation.records import SnapshotInfo, TaskResult, read_task_csv
from evaluation.report import write_report

PLOTS = ("validation.png", "replay.png", "tags.png", "interface.png", "cost.png")
# snapshot -> view -> successes over tasks t0..t3 (categories a, a, b, b)
OUTCOMES = {
    "A_0": {"validation": "1000", "id": "0000", "ood": "1000", "replay": "1100"},
    "A_1": {"validation": "1010", "id": "1000", "ood": "1000", "replay": "1000"},
    "final": {"validation": "1111", "id": "1010", "ood": "0000", "replay": "1110"},
}
SNAPSHOTS = [
    SnapshotInfo("A_0", 0, 0, 0),
    SnapshotInfo("A_1", 4, 4, 1, wall_s=60.0, update_tokens=4000),
    SnapshotInfo("final", 8, 8, 2, wall_s=130.0, update_tokens=8800),
]
ROUNDS = [
    {
        "step": s,
        "tag_fractions": {"pass": 0.2 + 0.1 * s, "state_mismatch": 0.8 - 0.1 * s},
        "tag_weights": {"pass": 1.0, "state_mismatch": 1.0 + 0.1 * s},
        "interface_version": s // 3,
        "active_guidelines": ["state_aware"] if s >= 3 else [],
        "reward_mean": 0.1 * s,
    }
    for s in range(1, 9)
]


def make_results() -> list[TaskResult]:
    return [
        TaskResult(
            snap,
            view,
            f"{view}_t{i}",
            "a" if i < 2 else "b",
            c == "1",
            float(c == "1"),
            2,
            50,
            500,
            3.0,
            "timeout after 60 s" if (snap, view, i) == ("A_1", "replay", 1) else None,
        )
        for snap, views in OUTCOMES.items()
        for view, row in views.items()
        for i, c in enumerate(row)
    ]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    results = make_results()
    summary = summarize(results, SNAPSHOTS)
    return write_report(summary, results, ROUNDS, out), summary, results


def test_writes_markdown_and_every_plot(report):
    path, _, _ = report
    assert path.name == "report.md" and path.stat().st_size > 0
    text = path.read_text()
    for name in PLOTS:
        png = path.parent / name
        assert png.stat().st_size > 1000, name
        with Image.open(png) as img:  # a real, decodable PNG of a readable size
            assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 200
        assert f"]({name})" in text, f"report does not embed {name}"


def test_main_table_holds_the_macro_numbers(report):
    text = report[0].read_text()
    # columns in role order: validation, id, ood, replay; macro over categories a and b
    assert "| snapshot | validation | id | ood | replay |" in text
    assert "| A_0 | 25.0 | 0.0 | 25.0 | 50.0 |" in text
    assert "| A_1 | 50.0 | 25.0 | 25.0 | 25.0 |" in text
    assert "| final | 100.0 | 50.0 | 0.0 | 75.0 |" in text


def test_gains_churn_cost_and_best_validation_are_reported(report):
    text = report[0].read_text()
    assert "| A_1 | +25.0 pp | +25.0 pp |" in text and "| final | +50.0 pp | +75.0 pp |" in text
    assert "ID gain (final vs A_0, view `id`): +50.0 pp" in text
    assert "OOD gain (final vs A_0, view `ood`): -25.0 pp" in text
    # final is the best on validation here, and still listed as final too
    assert "| best validation | final | 100.0 | 50.0 | 0.0 | 75.0 |" in text
    assert "| final | final | 100.0 | 50.0 | 0.0 | 75.0 |" in text
    # replay A_0 -> A_1: t1 forgotten (1 of 4), forgetting 25 pp; A_0 failed t2, t3 and A_1 fixes neither
    assert "| A_1 | replay | 25.0 | 0.0 | 25.0 | 0.0 | 50.0 |" in text
    assert "| final | replay | 0.0 | 50.0 | 0.0 | 50.0 | 0.0 |" in text
    # 16 task runs per snapshot, 4 updates of 1000 then 1200 tokens each
    assert "| A_1 | 16 | 550.0 | 2.0 | 48.0 | 4 | 1,000.0 | 60.0 |" in text
    assert "| final | 16 | 550.0 | 2.0 | 48.0 | 4 | 1,200.0 | 70.0 |" in text
    assert "| A_1 | replay | 4 | 1 | 0 |" in text  # the timeout is a diagnostic


def test_side_files_round_trip(report):
    path, summary, results = report
    assert json.loads((path.parent / "summary.json").read_text()) == summary
    assert read_task_csv(path.parent / "results.csv") == results


def test_without_rounds_the_round_plots_are_skipped(tmp_path):
    results = make_results()
    path = write_report(summarize(results, SNAPSHOTS), results, [], tmp_path)
    text = path.read_text()
    assert not (tmp_path / "tags.png").exists() and "tags.png" not in text
    assert "No training rounds were given." in text
    assert (tmp_path / "cost.png").stat().st_size > 0


def test_importing_the_package_does_not_import_matplotlib():
    code = "import sys, evaluation.metrics, evaluation.report; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
