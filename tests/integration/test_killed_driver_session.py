"""A SIGKILLed driver's Ray session, ended (seal/runtime/ray_leftovers.py): a real local Ray started by
seal's start_ray and watched as `seal train` watches it, an actor whose process tree outlives it the
way a vLLM engine core did, the driver SIGKILLed. The session's guard ends what is left; killed
with the driver, the next start on the run directory does.

Without either, Ray's dashboard and runtime-env agents live about 60 s past the driver's death
(they report the raylet's death to the dead GCS first) and the actor's grandchild for good.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from seal.runtime.ray_leftovers import RECORD, dead_session, end_leftovers, session_processes, started_ticks

REPO = Path(__file__).resolve().parents[2]

# The driver: seal's local start and its watch, one actor with a child and a grandchild (as a
# replica's engine core and its worker: Ray kills a dying worker's children, not theirs).
DRIVER = """
import subprocess, sys, time
from pathlib import Path
import ray
from seal.cluster_config import ClusterConfig
from seal.runtime import ray_leftovers
from seal.runtime.placement import start_ray

run_dir = Path(sys.argv[1])
start_ray(ClusterConfig(env_actors=1, object_store_gb=0.1))
ray_leftovers.watch_session(run_dir)

@ray.remote(num_cpus=0)
class Engine:
    def start(self):
        nap = "import time; time.sleep(600)"
        core = f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {nap!r}]); print(p.pid, flush=True); time.sleep(600)"
        self.core = subprocess.Popen([sys.executable, "-c", core], stdout=subprocess.PIPE, text=True)
        return self.core.pid, int(self.core.stdout.readline())

engine = Engine.remote()
print("READY", *ray.get(engine.start.remote(), timeout=120), ray_leftovers._guards[-1].pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def ray_root():
    root = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # short: Ray's socket paths
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _start_driver(run_dir: Path, ray_root: Path) -> tuple[subprocess.Popen, list[int]]:
    """The driver, once its actor's processes run; their pids: core, its child, the session's guard."""
    env = {**os.environ, "RAY_TMPDIR": str(ray_root), "RAY_AUTH_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=run_dir,
    )
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY"):
            return proc, [int(x) for x in line.split()[1:]]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"the driver did not start its actor (rc {proc.poll()})")


def _gone(pids: dict[int, int | None], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(s is not None and started_ticks(p) == s for p, s in pids.items()):
        time.sleep(0.2)
    return not any(s is not None and started_ticks(p) == s for p, s in pids.items())


def _end_ours(driver: subprocess.Popen, ours: dict[int, int | None]) -> None:
    """Should a check fail: the driver and only those very processes it started."""
    if driver.poll() is None:
        driver.kill()
    for pid, started in ours.items():
        if started is not None and started_ticks(pid) == started:
            os.kill(pid, signal.SIGKILL)


# 40-55 s on 2 cores (2026-12-07, under other engineers' tests and a soak): Ray's start is most of it.
def test_the_guard_ends_a_killed_drivers_session(tmp_path, ray_root):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    driver, (core, core_child, guard) = _start_driver(run_dir, ray_root)
    ours = {pid: started_ticks(pid) for pid in (core, core_child, guard)}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # of no session
    try:
        assert dead_session(run_dir) is None  # its driver lives: nothing is left over yet
        session = str(next(ray_root.glob("ray/session_2*")).resolve())
        assert core_child in {p.pid for p in session_processes(session, skip=set())}

        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert _gone({guard: ours[guard]}, within_s=60), "the guard did not end"
        said = driver.stderr.read()  # the guard wrote to the driver's stderr, and has closed it
        assert session_processes(session, skip=set()) == []  # the agents' 60 s, the grandchild for good
        line = next(x for x in said.splitlines() if x.startswith("seal: ended "))
        assert session in line and f"({core_child})" in line, line
        assert started_ticks(bystander.pid) is not None  # another process lives on
        assert not (run_dir / RECORD).exists()
    finally:
        bystander.kill()
        _end_ours(driver, ours)


@pytest.mark.slow  # the same Ray start again (40-55 s); the guard's part above is the default suite's
def test_the_next_start_ends_what_a_driver_killed_with_its_guard_left(tmp_path, ray_root):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    driver, (core, core_child, guard) = _start_driver(run_dir, ray_root)
    ours = {pid: started_ticks(pid) for pid in (core, core_child, guard)}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # of no session
    try:
        assert dead_session(run_dir) is None  # its driver lives: nothing is left over yet, nothing is ended
        assert end_leftovers(run_dir, say=lambda _: None) == []
        assert (run_dir / RECORD).is_file()

        os.kill(guard, signal.SIGKILL)  # as `kill -9` of both by pid would
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        time.sleep(3)  # the kernel ends what Ray fate-shares (gcs_server, raylet): what is left is not
        session = dead_session(run_dir)
        assert session is not None and session.startswith(str(ray_root))
        before = {p.pid: p.title for p in session_processes(session, skip=set())}
        assert core_child in before, before  # the engine's worker outlives its actor
        assert any(t.startswith("ray::") for t in before.values()), before  # and Ray's own agents

        said: list[str] = []
        ended = end_leftovers(run_dir, say=said.append)
        assert {p.pid for p in ended} >= set(before) - {core}  # the core may have died with its actor meanwhile
        assert len(said) == 1 and said[0].startswith(f"ended {len(ended)} processes") and session in said[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and session_processes(session, skip=set()):
            time.sleep(0.2)
        assert session_processes(session, skip=set()) == []
        assert started_ticks(bystander.pid) is not None  # another process lives on
        assert not (run_dir / RECORD).exists()
        assert end_leftovers(run_dir, say=said.append) == [] and len(said) == 1  # once
    finally:
        bystander.kill()
        _end_ours(driver, ours)
