"""`seal evaluate --views tau2_retail,bfcl_memory_kv --limit 1` end to end:
real vLLM (the tiny random model) as the snapshot, tau2's orchestrator and
evaluator, bfcl-eval's memory data, backend and checker. The run directory
is a bare one (config + the A_0 snapshot of the base model): no training
is needed to check that the harness results reach the summary and the report.
The model is untrained, so only plumbing and labels are checked."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from seal.config import compose


def seal(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def bare_run(run_dir):
    """A run directory with only the A_0 snapshot (the base model)."""
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        OmegaConf.to_yaml(compose(["env=toy", "model=tiny", "generator.cpu_kv_cache_gb=1"]))
    )
    (run_dir / "snapshots").mkdir()
    record = {
        "name": "A_0",
        "step": 0,
        "policy_version": 0,
        "interface_version": 0,
        "weights": "tiny",
        "wall_s": 0.0,
        "update_tokens": 0,
    }
    (run_dir / "snapshots" / "index.jsonl").write_text(json.dumps(record) + "\n")
    return run_dir


@pytest.mark.slow  # two harnesses on vLLM: 41 s on 2 cores (CI, 2026-12-06)
def test_ood_harness_views_through_seal_evaluate(tmp_path):
    from seal.run.snapshots import INDEX, snapshot_root

    run = bare_run(tmp_path / "run")
    assert (snapshot_root(run) / INDEX).is_file()
    args = (
        "evaluate",
        str(run),
        "--views",
        "tau2_retail,bfcl_memory_kv,bfcl_web_search",
        "--limit",
        "1",
        "--json",
        "evaluation.max_new_tokens=16",
    )
    t0 = time.perf_counter()
    proc = seal(*args)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["snapshots"] == ["A_0"]
    assert set(out["success"]["A_0"]) == {"tau2_retail", "bfcl_memory_kv"}  # distinct view names
    assert set(out["success"]["A_0"]["tau2_retail"]["by_category"]) == {"retail"}
    assert set(out["success"]["A_0"]["bfcl_memory_kv"]["by_category"]) == {"kv"}
    assert {v: i["tasks"] for v, i in out["view_tasks"].items()} == {"tau2_retail": 1, "bfcl_memory_kv": 1}
    assert out["views"]["ood"] == "tau2_retail"  # no held-out-category view: the first harness view
    assert "needs network" in out["views_unavailable"]["bfcl_web_search"]
    assert "needs network" in out["views_unavailable"]["bfcl_memory_vector"]
    tau2_note, memory_note = out["ood_harnesses"]["tau2_retail"], out["ood_harnesses"]["bfcl_memory_kv"]
    assert tau2_note["user_simulator_weights"] == {"A_0": "tiny"} and "not comparable" in tau2_note["comparability"]
    assert "gpt-4.1" in tau2_note["comparability"] and memory_note["label"] == "BFCL V4 Memory (kv + rec_sum)"

    with open(run / "evaluation" / "results.csv", newline="") as f:
        rows = {r["view"]: r for r in csv.DictReader(f)}
    assert rows["tau2_retail"]["task_id"] == "tau2_retail/0" and rows["tau2_retail"]["category"] == "retail"
    assert rows["bfcl_memory_kv"]["task_id"] == "memory_kv_0-customer-0"
    for r in rows.values():
        assert r["process_error"] == "", r  # a harness crash would be recorded here
        assert r["outcome"] in ("completed", "step_limit", "context_overflow", "aborted")
    assert int(rows["bfcl_memory_kv"]["generated_tokens"]) > 0  # the question asked the model at least once
    details = [json.loads(line) for line in (run / "evaluation" / "ood" / "A_0.jsonl").read_text().splitlines()]
    tau2_detail = next(d for d in details if d["view"] == "tau2_retail")
    assert tau2_detail["simulator_model"] == "seal-user-simulator" and tau2_detail["termination"]
    assert tau2_detail["task_id"] == "tau2_retail/0" and tau2_detail["harness_task_id"] == "0"
    assert tau2_detail["agent_requests"] + tau2_detail["user_requests"] >= 1  # the endpoint served our model
    memory_detail = next(d for d in details if d["view"] == "bfcl_memory_kv")
    assert memory_detail["prereq_entries"] >= 1  # the scenario's chain was played before the question
    assert out["evaluation"]["per_snapshot"]["A_0"]["tasks_run"] == 2

    # Cached: a second evaluation runs nothing; the report carries the labels.
    proc = seal(*args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["evaluation"]["per_snapshot"]["A_0"]["tasks_run"] == 0
    proc = seal("report", str(run))
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = (run / "report" / "report.md").read_text()
    assert "## OOD harness views" in text and "BFCL V4 Memory (kv + rec_sum)" in text
    assert "user simulator" in text and "not comparable" in text
    print(f"seal evaluate (1 snapshot, 2 harness tasks): {wall:.0f} s")
