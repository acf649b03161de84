"""The environments of docs/custom-environment.md train through `seal train` as a user runs them: a
real subprocess, the tiny model, two learner steps, no closing evaluation.

- examples/minimal/ (one file and its YAML, partial credit, a reward-only verdict) copied to a folder
  outside the repository and trained by the page's own command, run from there with no PYTHONPATH:
  the config given by its path brings its module along, and the closing note says the interface had
  nothing to act on;
- the same env broken mid-run (a reward outside [0, 1] for any answer of the model's, which
  preflight's agents never give) stops the run at once in one line, no group done, never retried;
- examples/thermostat/ (the full diagnosis vocabulary) by `env=thermostat` from configs/env/."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "custom-environment.md"
# What makes a run short here, none of which changes what the page's command does.
FAST = [
    "learner=torch",
    "n=2",
    "trainer.oversample=0",
    "trainer.checkpoint_every=0",
    "sampling.max_new_tokens=16",
    "cluster.env_actors=1",
    "evaluation.final=false",
]
BROKEN = """
from units import UnitsEnv


class BrokenUnits(UnitsEnv):
    def judge(self):
        steps, texts = self.parsed_turns[-1], self.turn_texts[-1]
        if not steps or steps[-1].calls or texts[-1] in ("I cannot help with that.", self.task.turns[0].reply):
            return super().judge()  # what preflight's three agents play
        return 2.0  # any answer of the model's: a reward the contract refuses
"""


def page_command(prefix: str) -> list[str]:
    """The arguments of the first command on the page that starts with ``prefix``."""
    for line in PAGE.read_text().splitlines():
        if line.strip().startswith(prefix):
            return shlex.split(line.split("#")[0])[len(shlex.split(prefix)) :]
    raise AssertionError(f"docs/custom-environment.md shows no `{prefix}` command")


def seal(args: list[str], cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    ray_root = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))  # short: Ray's socket paths
    env = {**os.environ, "RAY_TMPDIR": str(ray_root)}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        return subprocess.run(
            [sys.executable, "-m", "seal.commands.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=600,
        )
    finally:
        shutil.rmtree(ray_root, ignore_errors=True)


def user_project(tmp_path: Path) -> Path:
    """examples/minimal/ as a user has it: a folder of their own, outside SEAL's packages."""
    project = tmp_path / "examples" / "minimal"
    shutil.copytree(REPO / "examples" / "minimal", project)
    return project


def test_the_minimal_env_trains_by_the_pages_command_from_a_folder_of_its_own(tmp_path):
    user_project(tmp_path)
    replay = seal(["env", "replay-gt", *page_command(".venv/bin/seal env replay-gt")], cwd=tmp_path)
    assert replay.returncode == 0 and "total             200       200   mean reward 1.00" in replay.stdout
    args = page_command(".venv/bin/seal train")
    assert args[0] == "env=examples/minimal/units.yaml" and "trainer.filter_groups=none" in args
    proc = seal(["train", *args, *FAST, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and not any(r["skipped"] for r in rows)
    assert all(set(r["tag_fractions"]) == {"unknown"} for r in rows)
    assert "env=UnitsEnv" in proc.stdout + proc.stderr
    assert "the interface and the A-Patch weights had nothing to act on" in proc.stdout
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert f"- {tmp_path / 'examples' / 'minimal'}" in config  # python_path: seal evaluate finds the module again


@pytest.mark.slow  # a whole run: 38 s on 2 cores (CI, 2026-12-06); the thermostat's run stays default
def test_a_verdict_out_of_bounds_mid_run_stops_the_run_in_one_line(tmp_path):
    project = user_project(tmp_path)
    (project / "broken_units.py").write_text(BROKEN)
    (project / "broken_units.yaml").write_text("_target_: broken_units.BrokenUnits\n")
    args = ["env=examples/minimal/broken_units.yaml", "model=tiny", "trainer.filter_groups=none", *FAST]
    proc = seal(["train", *args, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "seal: error: env broken_units.BrokenUnits.judge: reward 2.0 is not a number in [0, 1] "
        "(docs/custom-environment.md); the run stops: a verdict the contract refuses is the env's to fix"
    )
    output = proc.stdout + proc.stderr
    assert not re.search(r"group +\S+ done", output) and "given up" not in output  # no group, no retry
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()


def test_the_thermostat_trains_two_steps_through_seal_train(tmp_path):
    run_dir = tmp_path / "run"
    args = ["env=thermostat", "model=tiny", "trainer.steps=2", "trainer.filter_groups=none", *FAST]
    # The folder holding examples/ on the path of every process of the run, as its config says.
    proc = seal(["train", *args, f"run_dir={run_dir}"], cwd=tmp_path, pythonpath=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "env=ThermostatEnv" in proc.stdout + proc.stderr
