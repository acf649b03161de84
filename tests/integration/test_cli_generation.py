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


METRIC_KEYS = {"step", "policy_version", "reward_mean", "staleness_mean", "staleness_max", "mean_scale", "tag_weights",
               "tag_fractions", "interface_version", "active_guidelines", "gen_tokens_per_s", "learner_samples_per_s",
               "dropped", "reissued", "rejected"}


def test_train_runs_checkpoints_and_resumes(tmp_path):
    run = tmp_path / "run"
    # trainer.filter_groups=none: the tiny model's groups all have equal rewards, and this test counts updates.
    proc = seal("train", "env=toy", "model=tiny", "n=4", "trainer.steps=2", "trainer.mode=sync", "trainer.filter_groups=none",
                f"run_dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seal scale" in proc.stdout and "tensorboard --logdir" in proc.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(METRIC_KEYS <= set(r) for r in rows)
    assert [r["policy_version"] for r in rows] == [1, 2] and rows[-1]["staleness_max"] == 0
    # The tiny model never calls a tool: empty turns dominate, and the closed
    # loop turns on the matching guideline once there are 8 of them.
    assert rows[-1]["tag_fractions"] == {"empty_turn_model_response": 1.0}
    assert rows[-1]["active_guidelines"] == ["active_respond"] and rows[-1]["interface_version"] == 1
    assert rows[-1]["tag_weights"]["empty_turn_model_response"] > 1.5
    assert (run / "checkpoints" / "latest" / "learner.json").is_file() and list((run / "tensorboard").iterdir())
    assert len((run / "rounds.jsonl").read_text().splitlines()) == 2

    proc = seal("train", "env=toy", "model=tiny", "n=4", "trainer.steps=1", "trainer.mode=sync", "trainer.filter_groups=none",
                f"resume={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed at step 2, policy version 2" in proc.stdout
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["interface_version"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["policy_version"] == 3
    assert len(json.loads((run / "run.json").read_text())["resumed"]) == 1


def test_train_refuses_what_it_cannot_do(tmp_path):
    proc = seal("train", "trainer.mode=async", "trainer.max_staleness=0")
    assert proc.returncode == 2 and "max_staleness >= 1" in proc.stderr
    proc = seal("train", "trainer.mode=overlapped")
    assert proc.returncode == 2 and "sync or async" in proc.stderr
    proc = seal("scale", str(tmp_path), "env=2")
    assert proc.returncode == 2 and "no running pipeline" in proc.stderr
    proc = seal("scale", str(tmp_path), "env=0")
    assert proc.returncode == 2 and "env=N with N >= 1" in proc.stderr
    proc = seal("train", f"resume={tmp_path}")
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
