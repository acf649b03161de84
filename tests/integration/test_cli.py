"""The `seal` command as a user runs it (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from env_pool.bfcl.replay import ground_truth_turns
from env_pool.bfcl.tasks import get_task


def seal(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", *args], capture_output=True, text=True, input=stdin, timeout=300
    )


def test_help_imports_nothing_heavy():
    code = "import sys, seal.commands.cli; seal.commands.cli.build_parser(); print(sorted(m for m in ('torch', 'bfcl_eval', 'hydra', 'transformers', 'vllm', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert seal("--help").returncode == 0


def test_score_reports_each_line_and_keeps_going_after_bad_ones(tmp_path):
    good = ground_truth_turns(get_task("multi_turn_base_0"), "json")
    bad = [list(t) for t in good]
    bad[1] = ["I cannot do that."]
    lines = [
        json.dumps({"task_id": "multi_turn_base_0", "turns": good}),
        json.dumps({"task_id": "multi_turn_base_0", "turns": bad}),
        "{not json",
        json.dumps({"task_id": "multi_turn_base_9999", "turns": []}),
        json.dumps({"task_id": "multi_turn_base_1", "turns": "nope"}),
        "",
        json.dumps({"task_id": "multi_turn_base_1", "turns": good[:1]}),
    ]
    path = tmp_path / "traj.jsonl"
    path.write_text("\n".join(lines) + "\n")
    proc = seal("env", "score", str(path), "--json", "--official")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1 and "3 malformed line(s)" in proc.stderr and "differ" not in proc.stderr
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 7]
    assert (
        rows[0]["reward"] == 1 and rows[0]["error"] is None and set(rows[0]["tags"]) <= {"pass", "correct_abstention"}
    )
    assert (
        rows[1]["reward"] == 0
        and rows[1]["tags"][1] == "empty_turn_model_response"
        and rows[1]["labels"][1] == "missing_tool_call"
    )
    assert rows[1]["error_type"] == "multi_turn:empty_turn_model_response" and 0 < rows[1]["progress"] < 1
    assert "not valid JSON" in rows[2]["error"]
    assert "unknown BFCL task id" in rows[3]["error"] and rows[3]["task_id"] == "multi_turn_base_9999"
    assert "turns must be" in rows[4]["error"] and rows[4]["task_id"] == "multi_turn_base_1"
    assert rows[5]["error_type"] == "multi_turn:force_terminated"
    assert all(r.get("official", {}).get("reward", r["reward"]) == r["reward"] for r in rows)
    assert set(rows[0]) >= {"line", "task_id", "reward", "tags", "labels", "progress", "error_type", "error"}


def test_score_text_mode_reads_stdin():
    turns = ground_truth_turns(get_task("multi_turn_base_0"), "python")
    proc = seal(
        "env", "score", "-", "--format", "python", stdin=json.dumps({"task_id": "multi_turn_base_0", "turns": turns})
    )
    assert proc.returncode == 0 and "reward=1" in proc.stdout and "tags:" in proc.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("env", "show", "multi_turn_nope_3"), "unknown BFCL task id"),
        (("env", "show", "multi_turn_base_0", "--interface", "lite,magic"), "unknown interface component"),
        (("env", "score", "/no/such/file.jsonl"), "no such file"),
        (("train", "env=nope"), "env=nope: no such option (the env options are bfcl shopping "),
        (("env", "show", "shop_0", "env=toy"), "task shop_0 is a shopping task, not toy's: leave out env=toy"),
        (("env", "replay-gt", "env=nope"), "env=nope: no such option (the env options are bfcl shopping "),
        (("env", "show", "conv_0"), "; an env of your own: add env=NAME or env=path/to/its.yaml"),
        (("env", "show", "foo_1"), "no environment has task id 'foo_1' (task ids start with multi_turn_, shop_, toy_"),
    ],
)
def test_user_errors_are_one_line(args, fragment):
    proc = seal(*args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("seal: error:") and fragment in proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_lets_a_person_diff_raw_and_training():
    raw = seal("env", "show", "multi_turn_miss_func_0").stdout
    train = seal(
        "env",
        "show",
        "multi_turn_miss_func_0",
        "--interface",
        "lite,feedback,guidelines",
        "--guidelines",
        "state_aware",
    ).stdout
    assert "[required]" not in raw and "[required]" in train and "Guidelines:" in train
    assert "=== user (turn 3) ===" in raw and "I have updated some more functions" in raw


def test_replay_gt_json_shape():
    proc = seal("env", "replay-gt", "env=bfcl", "--split", "test", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["tasks"] == out["reward_1"] == 400
    assert out["by_category"] == {
        c: {"tasks": 100, "reward_1": 100} for c in ("base", "miss_func", "miss_param", "long_context")
    }
    assert set(out["tags"]) == {"pass", "correct_abstention"}


@pytest.mark.parametrize(("env", "tasks", "categories"), [("shopping", 480, 3), ("toy", 300, 3)])
def test_every_env_command_serves_the_built_in_envs(tmp_path, env, tasks, categories):
    from env_pool.shopping.env import ShoppingEnv
    from env_pool.toy.env import ToyToolEnv

    proc = seal("env", "replay-gt", f"env={env}", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["env"] == env and out["tasks"] == out["reward_1"] == tasks
    assert len(out["by_category"]) == categories
    first = f"{'shop' if env == 'shopping' else 'toy'}_0"
    shown = seal("env", "show", first)  # the task id names its env
    assert shown.returncode == 0 and shown.stdout.startswith(f"# {first} (") and f"env={env}" in shown.stdout
    assert "=== user (turn 0) ===" in shown.stdout
    reference = (ShoppingEnv("python") if env == "shopping" else ToyToolEnv()).reference_turns(first)
    lines = [{"task_id": first, "turns": reference}, {"task_id": first, "turns": [["I cannot help with that."]]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = [json.loads(line) for line in seal("env", "score", str(path), "--json").stdout.splitlines()]
    assert [r["reward"] for r in rows] == [1, 0] and rows[0]["error"] is None and rows[1]["tags"]
    official = seal("env", "score", str(path), "--official", "--json")
    assert official.returncode == 1 and "bfcl-eval's checker: bfcl tasks only" in official.stdout
