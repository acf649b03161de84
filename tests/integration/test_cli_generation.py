"""`seal rollout` and `seal eval` end to end: real vLLM CPU, the tiny model."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
KEYS = {"task_id", "category", "group_id", "rollout_index", "reward", "progress", "tags", "labels", "policy_version",
        "interface_version", "token_ids", "loss_mask", "logprobs", "num_tool_calls", "timings"}


def seal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seal.cli", *args], capture_output=True, text=True, timeout=600)


def test_rollout_writes_tagged_groups(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = seal("rollout", "--tasks", "2", "--n", "3", "--out", str(out), "model=tiny", "sampling.max_new_tokens=16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(KEYS <= set(r) for r in rows)
    assert len({r["group_id"] for r in rows}) == 2 and {r["rollout_index"] for r in rows} == {0, 1, 2}
    assert all(r["interface_version"] == 0 and len(r["tags"]) == len(r["labels"]) > 0 for r in rows)
    assert "mean reward" in proc.stdout and "prefix-cache hit rate" in proc.stdout


def test_eval_reports_macro_average(tmp_path):
    proc = seal("eval", "--split", "test", "--limit", "3", "--json", "model=tiny", "env=toy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tasks"] == 3 and set(out["by_category"]) <= {"add", "multiply", "get_weather"}
    assert out["overall"] == pytest.approx(sum(out["by_category"].values()) / len(out["by_category"]))
