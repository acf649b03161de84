"""The example environment of docs/custom-environment.md (examples/thermostat/, a module outside
SEAL's packages) trains through `seal train env=thermostat`, as a user runs it: a real subprocess,
the tiny model, two learner steps, no closing evaluation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_example_env_trains_two_steps_through_seal_train(tmp_path):
    run_dir = tmp_path / "run"
    ray_root = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))  # short: Ray's socket paths
    env = {
        **os.environ,
        "RAY_TMPDIR": str(ray_root),
        # The page's command: the folder holding examples/ on the path of every process of the run.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    args = [
        "env=thermostat",
        "model=tiny",
        "learner=torch",
        "n=2",
        "trainer.steps=2",
        "trainer.filter_groups=none",  # the tiny model earns no reward: every group trains
        "trainer.oversample=0",
        "trainer.checkpoint_every=0",
        "sampling.max_new_tokens=16",
        "cluster.env_actors=1",
        "evaluation.final=false",
        f"run_dir={run_dir}",
    ]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "seal.commands.cli", "train", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
    finally:
        shutil.rmtree(ray_root, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "env=ThermostatEnv" in proc.stdout + proc.stderr
