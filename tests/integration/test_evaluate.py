"""`seal train` -> `seal evaluate` -> `seal report` end to end on CPU: real Ray
pipeline, real vLLM (tiny model), the toy env. Evaluation must leave every
training artifact (checkpoint, snapshots with their capability state and
interface, metrics) byte for byte as it found them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

OWN = ("evaluation", "report")  # the only folders evaluation may write


def seal(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def training_state(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.relative_to(run).parts[0] not in OWN
    }


def test_train_evaluate_report(tmp_path):
    run = tmp_path / "run"
    t0 = time.perf_counter()
    # trainer.filter_groups=none: the tiny model's groups all have equal rewards, and this test counts updates.
    proc = seal(
        "train",
        "env=toy",
        "model=tiny",
        "learner=torch",
        "n=4",
        "trainer.steps=2",
        "trainer.groups_per_step=1",
        "trainer.snapshot_every=1",
        "trainer.filter_groups=none",
        "trainer.oversample=0",
        "sampling.max_new_tokens=32",
        "evaluation.final=false",
        f"run_dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    t_train = time.perf_counter() - t0
    before = training_state(run)
    assert any(k.endswith("capability.json") for k in before) and any(k.startswith("checkpoints/") for k in before)

    evaluate = (
        "evaluate",
        str(run),
        "--limit",
        "4",
        "--snapshots",
        "A_0,A_2",
        "--json",
        "evaluation.max_new_tokens=32",
    )
    t0 = time.perf_counter()
    proc = seal(*evaluate)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t_eval = time.perf_counter() - t0
    out = json.loads(proc.stdout)  # stdout holds the JSON alone: engine logs go to stderr
    assert out["snapshots"] == ["A_0", "A_2"]
    for key in ("success", "uvg_prev", "uvg_base", "forget_rate", "fix_rate", "cost", "best_validation", "schedule"):
        assert key in out, key
    assert set(out["success"]) == {"A_0", "A_2"}
    for snap in ("A_0", "A_2"):
        assert set(out["success"][snap]) == {"validation", "id", "replay"}  # ood: no held-out categories configured
        for entry in out["success"][snap].values():
            assert 0.0 <= entry["overall"] <= 1.0 and set(entry["by_category"]) <= {"add", "multiply", "get_weather"}
    assert out["view_tasks"]["validation"]["tasks"] == 4 and out["view_tasks"]["id"]["tasks"] == 4
    assert out["view_tasks"]["replay"]["tasks"] == 2  # 2 learner steps x 1 group: the two tasks trained on
    assert "ood" in out["views_unavailable"] and out["ood_gain"] is None
    assert set(out["uvg_base"]) == {"A_2"} and out["best_validation"] in ("A_0", "A_2") and out["final"] == "A_2"
    assert out["evaluation"]["temperature"] == 0.0 and out["evaluation"]["interface"] == "raw"
    assert out["evaluation"]["validation_in_training_pool"] == 0  # training never saw a validation task
    assert out["schedule"]["batch_size"] == 4 and out["schedule"]["assessment_timing"] == 1
    assert out["cost"]["A_2"]["updates"] == 2 and out["cost"]["A_2"]["update_tokens_per_update"] > 0
    assert all(out["cost"][s]["tasks"] == 10 for s in ("A_0", "A_2"))
    assert [out["evaluation"]["per_snapshot"][s]["tasks_run"] for s in ("A_0", "A_2")] == [10, 10]
    rows = (run / "evaluation" / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 20 and rows[0].startswith("snapshot,view,task_id,category,success")

    # A second evaluation runs nothing again: every result comes from the cache.
    proc = seal(*evaluate)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout)
    assert [again["evaluation"]["per_snapshot"][s]["tasks_run"] for s in ("A_0", "A_2")] == [0, 0]
    assert again["success"] == out["success"]

    proc = seal("report", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run / "report"
    for name in (
        "report.md",
        "summary.json",
        "results.csv",
        "validation.png",
        "replay.png",
        "tags.png",
        "interface.png",
        "cost.png",
    ):
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
    text = (report / "report.md").read_text()
    assert "## Best validation vs final" in text and "| batch_size | 4 |" in text

    assert training_state(run) == before  # nothing but evaluation/ and report/ changed
    print(f"train {t_train:.0f} s, evaluate {t_eval:.0f} s")
