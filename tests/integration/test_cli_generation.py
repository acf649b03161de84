"""`seal rollout` and `seal eval` end to end: real vLLM CPU, the tiny model."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
KEYS = {"task_id", "category", "group_id", "rollout_index", "reward", "progress", "tags", "labels", "policy_version",
        "interface_version", "token_ids", "loss_mask", "logprobs", "num_tool_calls", "timings"}


def seal(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seal.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def test_rollout_writes_tagged_groups_and_skips_what_cannot_fit(tmp_path):
    out = tmp_path / "r.jsonl"
    # BFCL's first training tasks include opening prompts longer than the tiny model's 8K context less 16.
    proc = seal("rollout", "--tasks", "4", "--n", "3", "--out", str(out), "env=bfcl", "model=tiny", "sampling.max_new_tokens=16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (note,) = [line for line in proc.stdout.splitlines() if line.startswith("skipped ")]
    m = re.fullmatch(r"skipped (\d) of 4 tasks \(([^)]*)\): opening prompt longer than 8176 tokens "
                     r"\(model context 8192 minus sampling.max_new_tokens 16\)", note)
    assert m and int(m[1]) == len(m[2].split(", ")) >= 1, note
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kept = 4 - int(m[1])
    assert len(rows) == 3 * kept and all(KEYS <= set(r) for r in rows)
    assert not {r["task_id"] for r in rows} & set(m[2].split(", ")) and all(r["outcome"] != "context_overflow" for r in rows)
    assert len({r["group_id"] for r in rows}) == kept and {r["rollout_index"] for r in rows} == {0, 1, 2}
    assert all(r["interface_version"] == 0 and len(r["tags"]) == len(r["labels"]) > 0 for r in rows)
    assert "mean reward" in proc.stdout and "prefix-cache hit rate" in proc.stdout


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_named_tasks_that_cannot_fit_are_refused_before_the_engine(tmp_path, command):
    out = tmp_path / "r.jsonl"
    args = ["--out", str(out)] if command == "rollout" else []
    # multi_turn_base_77: about 8.3K tokens with either interface, over 8192 - 128.
    proc = seal(command, "--task-ids", "multi_turn_base_0,multi_turn_base_77", *args, "env=bfcl", "model=tiny", "sampling.max_new_tokens=128")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert re.fullmatch(r"seal: error: task multi_turn_base_77: its opening prompt is \d+ tokens, longer than 8064 tokens "
                        r"\(model context 8192 minus sampling.max_new_tokens 128\)\n", proc.stderr), proc.stderr
    assert "starting generator" not in proc.stderr and not out.exists()


def test_eval_reports_macro_average(tmp_path):
    proc = seal("eval", "--split", "test", "--limit", "3", "--json", "model=tiny", "env=toy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tasks"] == 3 and out["skipped"] == 0 and set(out["by_category"]) <= {"add", "multiply", "get_weather"}
    assert out["overall"] == pytest.approx(sum(out["by_category"].values()) / len(out["by_category"]))


METRIC_KEYS = {"step", "policy_version", "reward_mean", "staleness_mean", "staleness_max", "mean_scale", "tag_weights",
               "tag_fractions", "interface_version", "active_guidelines", "gen_tokens_per_s", "learner_samples_per_s",
               "dropped", "reissued", "rejected"}


def test_train_runs_checkpoints_and_resumes(tmp_path):
    run = tmp_path / "run"
    # Its own Ray temp root (short: Ray's socket paths have a length limit): the session it starts
    # shows there, which is what tests/integration/test_cli_train.py relies on to see none started.
    ray_root = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))
    # trainer.filter_groups=none: the tiny model's groups all have equal rewards, and this test counts updates.
    proc = seal("train", "env=toy", "model=tiny", "n=4", "trainer.steps=2", "trainer.mode=sync", "trainer.filter_groups=none",
                f"run_dir={run}", env={"RAY_TMPDIR": str(ray_root)})
    sessions = list((ray_root / "ray").glob("session_2*"))
    shutil.rmtree(ray_root, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(sessions) == 1
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
