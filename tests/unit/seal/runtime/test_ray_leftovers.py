"""seal/runtime/ray_leftovers.py without Ray: real processes that hold files of a session directory
open, as Ray's processes hold their logs. Only a dead driver's session is ended, only its writers,
never a session whose name merely starts the same, nor one whose driver lives.
(tests/integration/test_killed_driver_session.py: a real Ray session, its driver SIGKILLed.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seal.runtime.ray_leftovers import RECORD, boot_id, dead_session, end_leftovers, session_processes, started_ticks


def _holder(path: Path, mode: str) -> subprocess.Popen:
    """A process holding ``path`` open (mode "a": as Ray's processes hold their logs; "r": a reader)."""
    code = f"import sys, time; f = open({str(path)!r}, {mode!r}); print('open', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "open"
    return proc


def _record(run_dir: Path, session: Path, driver_pid: int, driver_started: int | None, boot: str) -> None:
    record = {"session_dir": str(session), "driver_pid": driver_pid, "driver_started": driver_started, "boot_id": boot}
    (run_dir / RECORD).write_text(json.dumps(record))


@pytest.fixture
def sessions(tmp_path):
    """Two session directories whose names share a prefix, each with a log file."""
    a, b = tmp_path / "ray" / "session_1_12", tmp_path / "ray" / "session_1_123"
    for s in (a, b):
        (s / "logs").mkdir(parents=True)
        (s / "logs" / "raylet.out").write_text("")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return a, b, run_dir


def test_a_dead_drivers_writers_are_ended_and_no_one_else(sessions):
    a, b, run_dir = sessions
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a driver that has exited: its pid, with a start time no live process has
    writer, reader, other = _holder(a / "logs" / "raylet.out", "a"), _holder(a / "logs" / "raylet.out", "r"), None
    try:
        other = _holder(b / "logs" / "raylet.out", "a")  # another session, its name starting like this one's
        assert {p.pid for p in session_processes(str(a), skip=set())} == {writer.pid}
        _record(run_dir, a, dead_pid, 1, boot_id())
        said: list[str] = []
        ended = end_leftovers(run_dir, say=said.append)
        assert [p.pid for p in ended] == [writer.pid]
        assert writer.wait(timeout=10) != 0  # ended by its SIGTERM
        assert said == [f"ended 1 process a killed driver's Ray session left running ({a}): python ({writer.pid})"]
        assert reader.poll() is None and other.poll() is None
        assert not (run_dir / RECORD).exists()
    finally:
        for p in (writer, reader, other):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_live_driver_another_boot_or_no_record_ends_nothing(sessions):
    a, _, run_dir = sessions
    writer = _holder(a / "logs" / "raylet.out", "a")
    try:
        assert dead_session(run_dir) is None and end_leftovers(run_dir) == []  # no record
        _record(run_dir, a, os.getpid(), started_ticks(os.getpid()), boot_id())  # its driver lives
        assert dead_session(run_dir) is None and end_leftovers(run_dir) == []
        _record(run_dir, a, 1 << 22, 1, "another-boot")  # pids and /tmp mean nothing after a reboot
        assert dead_session(run_dir) is None and end_leftovers(run_dir) == []
        time.sleep(0.2)
        assert writer.poll() is None
    finally:
        writer.kill()
        writer.wait()
