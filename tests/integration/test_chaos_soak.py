"""`seal chaos --one-each`: the real pipeline under one fault of every kind (a fixed seed), the faults
overlapping the recoveries they cause; nothing lost, nothing trained twice, every checkpoint loads,
the run completes (benchmarks/chaos/, docs/reliability.md). Mounts a tmpfs: root only. Slow: the
run restarts three times (learner kill, driver kill, disk full), a minute each on a quiet machine and
five under a load average of 40, where 25 minutes reached 9 of the 10 kinds: hence the 45-minute bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos.schedule import KINDS

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")]


def test_one_fault_of_each_kind_loses_nothing_and_trains_nothing_twice(tmp_path):
    out = tmp_path / "soak"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos.cli", "--one-each", "--gap-s", "10", "--seed", "1"]
        + ["--minutes", "45", "--out", str(out), "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60 * 60,
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = json.dumps(report["invocations"], indent=1)
    assert report["faults"] == {k: 1 for k in KINDS} and report["disk_full_not_hit"] == 0, report["injected"]
    assert report["triggers_claimed"] == {"engine_error": 1, "weight_round": 1}
    g = report["groups"]
    assert g["groups_lost"] == [] and g["groups_trained_twice"] == [] and g["trained_not_finished"] == [], g
    assert g["groups_trained"] >= report["steps"] > 0 and g["lineage_gaps"] == [], g
    assert report["storage"]["all_load"] and report["storage"]["checkpoints"]["latest"]["step"] == report["steps"]
    assert report["completed"] and done.returncode == 0, said
    assert report["tokens"]["closed_invocations"] >= 1 and report["tokens"]["unattributed"] == 0, report["tokens"]
    # Each run-ending fault ended its invocation with the line that names it.
    # (The soak itself ends the invocation it settles on, "soak_end", then resumes once to finish.)
    ended = {inv["ended_by"]: inv for inv in report["invocations"] if inv["ended_by"] not in (None, "soak_end")}
    assert set(ended) == {"learner_kill", "driver_kill", "disk_full"}, said
    assert [inv["ended_by"] for inv in report["invocations"][-2:]] == ["soak_end", None], said
    assert "no space left on device writing the learner checkpoint" in ended["disk_full"]["last_line"], said
    assert "learner rank 0" in ended["learner_kill"]["last_line"] and ended["driver_kill"]["rc"] == -9, said
    assert all(inv["leftover_processes"] == 0 for inv in report["invocations"]), said
