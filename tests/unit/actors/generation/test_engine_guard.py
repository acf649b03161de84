"""actors/generation/engine_guard.py: an actor's vLLM processes die with it, even SIGKILLed. Real
processes titled as vLLM titles them (argv[0]): an "actor" with an engine core child, the core's
worker under it, and a child of the actor that is not vLLM's (a Python run under another argv[0]
cannot find itself: the executable is named to it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from actors.generation.engine_guard import start_guard, tree

REPO = Path(__file__).resolve().parents[4]

ACTOR = f"""
import subprocess, sys, time
sys.path.insert(0, {str(REPO)!r})
from actors.generation.engine_guard import start_guard
nap = "import time; time.sleep(120)"
core_code = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen(['VLLM::Worker', '-c', {{nap!r}}], executable={{sys.executable!r}}); "
    "print(p.pid, flush=True); time.sleep(120)"
)
core = subprocess.Popen(["VLLM::EngineCore", "-c", core_code], executable=sys.executable, stdout=subprocess.PIPE, text=True)
worker = int(core.stdout.readline())
other = subprocess.Popen([sys.executable, "-c", nap])
guard = start_guard()
print(core.pid, worker, other.pid, guard.pid, flush=True)
time.sleep(120)
"""


def _start_time(pid: int) -> int | None:
    """A live process's start time; None once dead (a zombie awaiting its reaper included)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def test_the_engine_dies_with_its_sigkilled_actor_and_nothing_else_does():
    actor = subprocess.Popen([sys.executable, "-c", ACTOR], stdout=subprocess.PIPE, text=True)
    core, worker, other, guard = (int(x) for x in actor.stdout.readline().split())
    ours = {pid: _start_time(pid) for pid in (core, worker, other, guard)}
    try:
        assert all(ours.values()), ours
        assert tree({core: ours[core]}) == {core: ours[core], worker: ours[worker]}
        actor.send_signal(signal.SIGKILL)
        actor.wait()
        deadline = time.monotonic() + 30  # the guard's start, then SIGTERM (the nap dies of it)
        while time.monotonic() < deadline and (_start_time(core) or _start_time(worker)):
            time.sleep(0.2)
        assert _start_time(core) is None and _start_time(worker) is None
        assert _start_time(other) == ours[other]  # the actor's other child is not the engine's
    finally:
        if actor.poll() is None:
            actor.kill()
        for pid, started in ours.items():  # only these very processes
            if started is not None and _start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)


def test_an_in_process_engine_has_nothing_to_guard():
    nap = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a child, not vLLM's
    try:
        assert start_guard() is None
    finally:
        nap.kill()
        nap.wait()
