"""A SIGKILLed driver's Ray processes, ended by a guard at its death or the next start on its run.

Ray 2.60 fate-shares only the processes the driver starts itself (gcs_server, raylet, the
dashboard, the monitors: PR_SET_PDEATHSIG, ray/_private/services.py start_ray_process). What the
raylet starts sees it die and then lingers: the dashboard and runtime-env agents report the
raylet's death to the dead GCS before exiting and wait out that call's 60 s timeout
(ray/_private/process_watcher.py, ray/_private/utils.py publish_error_to_driver); a worker that
ends on a broken plasma-store connection skips Ray's killing of its children, and with the raylet
gone nothing ends its process group: a generator's vLLM engine core, its worker and their resource
tracker lived on for good (actors/generation/engine_guard.py now ends those with their replica).

A local start records its session (RUN_DIR/ray_session.json: the session directory, the driver's
pid and start time) and starts a guard that waits for the driver's death and then ends what is
left (``watch_session``). Should the guard die with it, a later start on the same run directory
whose recorded driver is dead does the same (``end_leftovers``). Either ends every process that
holds a file of THAT session directory open for writing (each Ray process writes its logs there;
an engine core inherits its actor's): never while the recorded driver lives, never a process of
another session or a reader of its logs, never one started after the scan (pid and start time
are checked again before each signal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RECORD = "ray_session.json"
TERM_GRACE_S = 5.0  # SIGTERM first (a vLLM engine core frees its shared memory), then SIGKILL
SETTLE_S = 2.0  # after the driver's death, before the guard looks: what Ray ends itself is not left over
_guards: list[subprocess.Popen] = []  # every session's guard this process started, held for its life


@dataclass(frozen=True)
class Leftover:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22): a reused pid is another process
    title: str  # its command line as Ray or vLLM titled it (ray::DashboardAgent, VLLM::EngineCore)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return None


def started_ticks(pid: int) -> int | None:
    """A live, non-zombie process's start time; None when gone (or a zombie: dead, awaiting its reaper)."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def boot_id() -> str:
    return (_read("/proc/sys/kernel/random/boot_id") or "").strip()


def watch_session(run_dir: Path) -> None:
    """After a local ray.init: record the session and start its guard (``start_guard``)."""
    from ray._private import worker  # no public API names the session directory

    node = worker._global_node
    if node is not None:
        write_record(run_dir, node.get_session_dir_path())
        start_guard(run_dir)


def write_record(run_dir: Path, session_dir: str) -> None:
    """RUN_DIR/ray_session.json: the session this process, its driver, started."""
    record = {
        "session_dir": str(Path(session_dir).resolve()),
        "driver_pid": os.getpid(),
        "driver_started": started_ticks(os.getpid()),
        "boot_id": boot_id(),
    }
    tmp = run_dir / (RECORD + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(run_dir / RECORD)


def start_guard(run_dir: Path) -> subprocess.Popen:
    """A process (``main``) that waits for this driver's death, by the end of a pipe only this
    process holds, then ends what its recorded session left, in one line on stderr. Its own session
    (``kill -9 -PGID`` of the driver's group does not reach it); one SIGKILLed by pid with the
    driver leaves the clean-up to the next start's ``end_leftovers``."""
    guard = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )
    _guards.append(guard)  # held: collected, it would close the pipe and end the wait under a live driver
    return guard


def session_processes(session_dir: str, skip: set[int]) -> list[Leftover]:
    """Every live process (but ``skip``) with a file under ``session_dir`` open."""
    prefix = session_dir.rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's
            continue
        if not any(_fd_target(pid, fd).startswith(prefix) and _writable(pid, fd) for fd in fds):
            continue
        started = started_ticks(pid)
        if started is not None:
            title = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
            found.append(Leftover(pid, started, title[:80]))
    return found


def _fd_target(pid: int, fd: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


def _writable(pid: int, fd: str) -> bool:
    """Open for writing (Ray's processes write their logs there; someone reading one, `tail -f`, does not)."""
    info = _read(f"/proc/{pid}/fdinfo/{fd}") or ""
    flags = next((line.split()[1] for line in info.splitlines() if line.startswith("flags:")), "0")
    return int(flags, 8) & (os.O_WRONLY | os.O_RDWR) != 0


def _signal(p: Leftover, sig: int) -> None:
    if started_ticks(p.pid) == p.started:  # still that process, not a reused pid
        try:
            os.kill(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def dead_session(run_dir: Path) -> str | None:
    """The session directory a dead driver of ``run_dir`` left (None: no record, its driver lives,
    or the machine rebooted since)."""
    try:
        record = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("boot_id") != boot_id():
        return None
    if started_ticks(int(record["driver_pid"])) == record.get("driver_started"):
        return None  # its driver still runs: nothing of it is left over
    return str(record["session_dir"])


def end_leftovers(run_dir: Path, say: Callable[[str], None] = print) -> list[Leftover]:
    """Before a local start on ``run_dir``: end what a dead driver's Ray session left running,
    with one line (``say``) naming it; the processes ended."""
    session = dead_session(run_dir)
    if session is None:
        return []
    left = session_processes(session, skip={os.getpid()})
    if left:
        for p in left:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < deadline and any(started_ticks(p.pid) == p.started for p in left):
            time.sleep(0.2)
        for p in left:
            _signal(p, signal.SIGKILL)
        names = ", ".join(f"{p.title.split(' ')[0].rsplit('/', 1)[-1]} ({p.pid})" for p in left)
        count = f"{len(left)} process" + ("" if len(left) == 1 else "es")
        say(f"ended {count} a killed driver's Ray session left running ({session}): {names}")
    (run_dir / RECORD).unlink(missing_ok=True)
    return left


def main(argv: list[str]) -> int:
    """The guard ``watch_session`` starts: ``python ray_leftovers.py RUN_DIR``."""
    # Ctrl-C or a hang-up reaches the driver, whose death ends this wait like any other.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # the driver never writes: only end of file comes
        pass
    time.sleep(SETTLE_S)
    end_leftovers(Path(argv[0]), say=lambda text: print(f"seal: {text}", file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
