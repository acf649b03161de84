"""scripts/gpu_check.sh without CUDA: one table, every row skipped with the reason, exit 0; the learner
rows themselves run on the CPU (--device cpu) so a GPU machine meets checks that have run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seal.commands.gpu_check import Row, check_names, main, summary_counts, table

REPO = Path(__file__).resolve().parents[4]


def _no_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the no-CUDA table is for CPU machines")


def test_without_cuda_every_row_is_skipped_and_it_exits_0(capsys):
    _no_cuda()
    assert main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["check"] for r in out["rows"]] == check_names()
    assert {r["status"] for r in out["rows"]} == {"skipped: no CUDA"} and out["failed"] == []
    assert "sees no CUDA device" in out["rows"][0]["detail"]


def test_the_script_prints_one_table():
    _no_cuda()
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].split() == ["check", "result", "detail"]
    body = [x for x in lines[2:] if x.strip() and not x.startswith("no check failed")]
    assert len(body) == len(check_names()) and all("skipped: no CUDA" in x for x in body)
    assert lines[-1] == "no check failed"


def test_table_and_pytest_counts():
    text = table([Row("CUDA device", "ok", "H100"), Row("pytest -m gpu", "FAIL", "1 failed")])
    assert text.splitlines()[2].startswith("CUDA device    ok    H100")
    assert summary_counts("....\n3 passed, 2 skipped, 1 failed in 9.1s\n") == {"passed": 3, "skipped": 2, "failed": 1}
    assert summary_counts("no tests ran") == {}


@pytest.mark.slow  # a learner step per row: about a minute on 2 cores (CI, 2026-12-06)
@pytest.mark.integration
def test_the_learner_rows_run_on_cpu():
    """The bf16 learner step, the reference's precision hook and the plan comparison, on the CPU (the
    GPU run uses the same code with device cuda)."""
    done = subprocess.run(
        [sys.executable, "-m", "seal.commands.gpu_check", "--device", "cpu", "--models", "tiny", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["check"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])["rows"]}
    assert (
        rows["learner bf16 step (tiny)"]["status"] == "ok"
        and "policy matmuls in bfloat16" in rows["learner bf16 step (tiny)"]["detail"]
    )
    assert rows["reference under autocast (tiny)"]["status"] == "ok"
    assert "seal plan" in rows["peak memory vs seal plan (tiny)"]["detail"]
    # Issue 46's rows (seal/commands/gpu_check_rows.py) on the CPU: gloo, small shapes.
    from seal.commands.gpu_check_rows import ROW_NAMES

    assert [rows[name]["status"] for name in ROW_NAMES] == ["ok"] * 3, [rows[n] for n in ROW_NAMES]


def test_the_checks_find_the_repository_they_run_the_gpu_tests_of():
    """gpu_check runs tests/ under its REPO: a module moved a level deeper must still find it."""
    from seal.commands import gpu_check

    assert gpu_check.REPO == REPO and (gpu_check.REPO / "tests").is_dir()


def test_on_one_gpu_without_ray_the_learner_group_gpu_tests_skip_and_none_errors():
    """Issue 38 item 4: the fixture started Ray (importing it) before the test body's skip, so on a
    one-GPU box without Ray three rows ERRORed and scripts/gpu_check.sh exited 1. Run under a plugin
    that fakes one CUDA device and hides Ray: every test skips."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.one_gpu_no_ray",
            "-p",
            "no:cacheprovider",
            "-m",
            "gpu",
            "-q",
            "-rs",
            "tests/integration/test_learner_group_gpu.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    counts = summary_counts(done.stdout)
    assert counts.get("skipped") == 3 and not (counts.keys() - {"skipped"}), done.stdout[-3000:]
    assert done.returncode == 0 and "could not import 'ray'" in done.stdout, done.stdout[-3000:]
