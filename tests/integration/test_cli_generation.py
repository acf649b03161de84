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

KEYS = {
    "task_id",
    "category",
    "group_id",
    "rollout_index",
    "reward",
    "progress",
    "tags",
    "labels",
    "policy_version",
    "interface_version",
    "token_ids",
    "loss_mask",
    "logprobs",
    "num_tool_calls",
    "timings",
}


def seal(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_rollout_writes_tagged_groups_and_skips_what_cannot_fit(tmp_path):
    out = tmp_path / "r.jsonl"
    # BFCL's first training tasks include opening prompts longer than the tiny model's 8K context less 16.
    proc = seal(
        "rollout", "--tasks", "4", "--n", "3", "--out", str(out), "env=bfcl", "model=tiny", "sampling.max_new_tokens=16"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (note,) = [line for line in proc.stdout.splitlines() if line.startswith("skipped ")]
    m = re.fullmatch(
        r"skipped (\d) of 4 tasks \(([^)]*)\): opening prompt longer than 8176 tokens "
        r"\(model context 8192 minus sampling.max_new_tokens 16\)",
        note,
    )
    assert m and int(m[1]) == len(m[2].split(", ")) >= 1, note
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kept = 4 - int(m[1])
    assert len(rows) == 3 * kept and all(KEYS <= set(r) for r in rows)
    assert not {r["task_id"] for r in rows} & set(m[2].split(", ")) and all(
        r["outcome"] != "context_overflow" for r in rows
    )
    assert len({r["group_id"] for r in rows}) == kept and {r["rollout_index"] for r in rows} == {0, 1, 2}
    assert all(r["interface_version"] == 0 and len(r["tags"]) == len(r["labels"]) > 0 for r in rows)
    assert "mean reward" in proc.stdout and "prefix-cache hit rate" in proc.stdout
    assert "WARNING" not in proc.stdout and "INFO" not in proc.stdout  # vLLM's logging goes to stderr


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_named_tasks_that_cannot_fit_are_refused_before_the_engine(tmp_path, command):
    out = tmp_path / "r.jsonl"
    args = ["--out", str(out)] if command == "rollout" else []
    # multi_turn_base_77: about 8.3K tokens with either interface, over 8192 - 128.
    proc = seal(
        command,
        "--task-ids",
        "multi_turn_base_0,multi_turn_base_77",
        *args,
        "env=bfcl",
        "model=tiny",
        "sampling.max_new_tokens=128",
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert re.fullmatch(
        r"seal: error: task multi_turn_base_77: its opening prompt is \d+ tokens, longer than 8064 tokens "
        r"\(model context 8192 minus sampling.max_new_tokens 128\)\n",
        proc.stderr,
    ), proc.stderr
    assert "starting generator" not in proc.stderr and not out.exists()


def test_eval_reports_macro_average(tmp_path):
    proc = seal("eval", "--split", "test", "--limit", "3", "--json", "model=tiny", "env=toy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)  # the JSON alone on stdout: the engine's logging goes to stderr
    assert "starting generator (VllmGenerator, model=tiny)" in proc.stderr  # the engine these commands run
    assert out["tasks"] == 3 and out["skipped"] == 0 and set(out["by_category"]) <= {"add", "multiply", "get_weather"}
    assert out["overall"] == pytest.approx(sum(out["by_category"].values()) / len(out["by_category"]))


METRIC_KEYS = {
    "step",
    "policy_version",
    "reward_mean",
    "staleness_mean",
    "staleness_max",
    "mean_scale",
    "tag_weights",
    "tag_fractions",
    "interface_version",
    "active_guidelines",
    "gen_tokens_per_s",
    "learner_samples_per_s",
    "dropped",
    "reissued",
    "rejected",
}


TRAIN = (
    "train",
    "env=toy",
    "model=tiny",
    "n=4",
    "trainer.mode=sync",
    "trainer.groups_per_step=1",  # the lines below count one group a step (the CPU default trains two)
    "trainer.filter_groups=none",
    "trainer.oversample=0",
    "evaluation.final_per_category=2",
)  # the closing frozen evaluation on 2 test tasks per category: 6 in all
LINE = re.compile(r"\[\d+:\d\d:\d\d\] (\w+) +(.+)")  # seal/run/progress.py: [elapsed] kind message
MAIN_JOB_DOC = Path(__file__).resolve().parents[2] / "docs" / "main-job.md"  # README's main-job section


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One short `seal train` (2 sync steps, tiny model, toy env) that several tests read; none writes into it."""
    run = tmp_path_factory.mktemp("train") / "run"
    # Its own Ray temp root (short: Ray's socket paths have a length limit): the session it starts
    # shows there, which is what tests/integration/test_cli_train.py relies on to see none started.
    ray_root = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))
    # trainer.filter_groups=none: the tiny model's groups all have equal rewards, and these tests count updates.
    proc = seal(*TRAIN, "trainer.steps=2", f"run_dir={run}", env={"RAY_TMPDIR": str(ray_root)})
    sessions = list((ray_root / "ray").glob("session_2*"))
    shutil.rmtree(ray_root, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(sessions) == 1
    return run, proc


def test_train_writes_metrics_and_checkpoints(first_run):
    run, _ = first_run
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


def test_train_shows_progress_then_a_closing_summary(first_run):
    from seal.commands.cli import build_parser

    run, proc = first_run
    progress, _, closing = proc.stdout.partition("\n\n")
    events = [LINE.fullmatch(x) for x in progress.splitlines()]
    assert all(events), progress  # every progress line has the one format
    said = [(m[1], m[2]) for m in events]

    def first(kind: str, start: str) -> int:
        return next(i for i, (k, text) in enumerate(said) if k == kind and text.startswith(start))

    # From the first seconds, in the order things happen.
    order = [
        first("tasks", "checking"),
        first("tasks", "160 tasks"),
        first("run", f"{run}: mode=sync"),
        first("ray", "starting Ray (local)"),
        first("ray", "Ray up in "),
        first("engine", "starting the generator (AsyncVllmGenerator, model tiny) and the learner (ZeRO-2)"),
        first("engine", "generator and learner ready in "),
        first("env", "env actors ready in "),
        first("group", "g0000000a0 started on env-"),
        first("learner", "step 1/2: train on 1 group (4 trajectories)"),
        first("learner", "publish policy v1"),
        first("step", "1/2: reward 0.00, loss "),
        first("step", "2/2: "),
        first("learner", "checkpoint step 2"),  # every 5 steps and at the run's last
        first("learner", "snapshot A_1 (step 2, policy v2)"),
        first("eval", "frozen evaluation of A_0 and A_1: 6 test tasks, raw interface, greedy"),
        first("eval", "the engine's own output goes to "),
        first("eval", "A_0: "),
        first("eval", "A_1: "),
    ]
    assert order == sorted(order), said
    # A group's report is its env actor's return value; its trajectories stream to the replay queue on
    # their own, so the learner may start on them before the report is read: only start < done holds.
    assert first("group", "g0000000a0 started on env-") < first("group", "g0000000a0 done on env-"), said
    assert "seal scale" in progress and "tensorboard --logdir" in closing
    done = [text for k, text in said if k == "group" and " done on " in text]
    assert len(done) == 2 and all(
        re.search(
            r"rewards 0 0 0 0 \(mean 0.00\), \d+ tokens \([\d.]+ tok/s\), policy v\d, "
            r"interface v\d$",
            t,
        )
        for t in done
    ), done
    steps = [text for k, text in said if k == "step"]
    assert len(steps) == 2 and re.search(r"; about .+ left$", steps[0]) and steps[1].endswith("; done")
    assert "policy v2, interface v1 (+active_respond)" in steps[1]  # the guideline turned on in round 2

    # The closing note: printed, and the same text in the run dir, beside the curves.
    assert closing == (run / "summary.txt").read_text()
    lines = closing.splitlines()
    assert re.fullmatch(
        rf"done: 2 steps in .+; reward 0.00 -> 0.00; held-in test success \d.\d\d -> \d.\d\d \(A_0 -> A_1, "
        rf"raw interface\); policy v2, interface v1; run dir {run}",
        lines[0],
    ), lines[0]
    assert lines[1] == "reward by step   ▁▁  0.00 -> 0.00 (range 0.00 to 0.00)"
    assert lines[2].startswith("by category      "), lines[
        2
    ]  # each toy task is its own kind: tests/unit/test_summary.py has the figures
    # The frozen evaluation: a head line, a row per category (3) and the pooled held-in row, the verdict.
    assert lines[3].startswith("frozen eval      A_0 -> A_1 on the same 6 test tasks, raw interface, greedy"), lines[3]
    assert [x.split()[0] for x in lines[4:8]] == ["add", "get_weather", "multiply", "held-in"], lines[4:8]
    assert lines[8].strip().startswith("on unseen test tasks, A_1 vs A_0: held-in (all): ")
    final = json.loads((run / "evaluation" / "final.json").read_text())
    assert final["tasks"] == 6 and final["settings"]["temperature"] == 0.0 and final["held_out"] == []
    assert (
        "Loading safetensors" in (run / "evaluation" / "final.log").read_text()
        and "Loading safetensors" not in proc.stdout
    )
    assert lines[9:11] == [
        "failure profile  step 1: empty_turn_model_response 1.00",
        " " * 17 + "step 2: empty_turn_model_response 1.00",
    ]
    assert "interface        v0 -> v1; guidelines turned on: active_respond (step 2)" in lines
    assert (
        f"snapshots        {run}/snapshots (A_0, A_1)" in lines
        and f"checkpoint       {run}/checkpoints/latest" in lines
    )
    (evaluate,) = [x for x in lines if x.startswith("evaluate ")]
    commands = evaluate.split(None, 1)[1].split(" && ")
    assert commands == [f".venv/bin/seal evaluate {run}", f".venv/bin/seal report {run}"]
    for command in commands:  # real `seal` commands with this run as their argument
        args = build_parser().parse_args(command.split()[1:])
        assert args.command in ("evaluate", "report") and args.run_dir == str(run)
    png = run / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"curves {png}" in closing


def docs_scalars() -> list[str]:
    """The tags docs/main-job.md lists under "TensorBoard scalars" (its first code block after that line)."""
    text = MAIN_JOB_DOC.read_text()
    block = text[text.index("TensorBoard scalars") :].split("```")[1]
    return [tok for tok in block.split() if "/" in tok]


def test_tensorboard_has_every_scalar_the_docs_list(first_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from seal.run.run_log import FAMILIES, SCALARS

    run, _ = first_run
    listed = docs_scalars()
    # docs/main-job.md and seal/run/run_log.py name the same scalars.
    assert sorted(t for t in listed if t.startswith("train/")) == sorted(f"train/{k}" for k in SCALARS)
    assert sorted(t.split("/")[0] for t in listed if t.endswith(">")) == sorted(FAMILIES)
    # Two event files: the run's (seal/run/run_log.py) and the closing evaluation's (seal/run/final_eval.py).
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars, tensors = acc.Tags()["scalars"], acc.Tags()["tensors"]
    assert "custom_scalars__config__" in tensors  # the layout a user sees first (seal/run/run_log.py LAYOUT)
    # Before/after at A_0's step (0) and the final one (2), one chart line per category and the held-in pool.
    assert [e.step for e in acc.Scalars("eval/held-in_all/success")] == [0, 2]
    assert {"eval/add/success", "eval/get_weather/success", "eval/multiply/success"} <= set(scalars)
    for tag in listed:
        if tag.endswith(">"):  # tag_weights/<tag>: one scalar per tag, category or stage
            assert any(s.startswith(tag.split("<")[0]) for s in scalars), tag
        elif tag == "interface/active_guidelines":
            assert any(t.startswith(tag) for t in tensors), tensors  # text
        else:
            assert tag in scalars, tag
            assert [e.step for e in acc.Scalars(tag)] == [1, 2], tag
    assert [e.value for e in acc.Scalars("train/interface_version")] == [0, 1]
    assert acc.Scalars("tag_weights/empty_turn_model_response")[-1].value > 1.5


@pytest.mark.slow  # about a minute on 2 cores (measured 2026-12-03); scripts/test.sh --all runs it
def test_train_resumes_quietly(first_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(first_run[0], run)  # the other tests read the first run as it was
    # The run's own config (tiny model, toy env, sync, n=4), not the default: the overrides are not repeated.
    proc = seal("train", "trainer.steps=1", f"resume={run}", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # --quiet: the closing note's first line alone, nothing on stderr.
    assert re.fullmatch(
        rf"done: 3 steps \(1 this time\) in .+; reward 0.00 -> 0.00; held-in test success \d.\d\d -> \d.\d\d "
        rf"\(A_0 -> A_2, raw interface\); policy v3, interface v1; run dir {run}\n",
        proc.stdout,
    ), proc.stdout
    assert proc.stderr == ""
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["interface_version"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["policy_version"] == 3
    assert len(json.loads((run / "run.json").read_text())["resumed"]) == 1
    assert (run / "summary.txt").read_text().startswith(proc.stdout)  # over the whole run, resumes included


def test_train_refuses_what_it_cannot_do(tmp_path):
    proc = seal("train", "trainer.mode=async", "trainer.max_staleness=0")
    assert proc.returncode == 2 and "max_staleness >= 1" in proc.stderr
    proc = seal("train", "trainer.mode=overlapped")
    assert proc.returncode == 2 and "sync or async" in proc.stderr
    proc = seal("scale", str(tmp_path), "env=2")
    assert proc.returncode == 2 and "no running pipeline" in proc.stderr
    proc = seal("scale", str(tmp_path), "env=0")
    assert proc.returncode == 2 and "env=N or generators=M with N, M >= 1" in proc.stderr
    proc = seal("train", f"resume={tmp_path}")
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
