"""The replica's engine processes die with the replica, however it dies.

vLLM's engine core is a child process of the replica's actor (multiprocessing on: the async engine,
and CUDA), its workers are the core's children, and nothing in vLLM 0.32 watches the actor: no
PR_SET_PDEATHSIG, no check of the parent. While the raylet lives it ends a dead worker's whole
process group, the engine's included ("DisconnectClient: sending SIGTERM to pgid"). Once the raylet
is gone (the driver SIGKILLed), only the worker itself kills its children, and only on some exits
(core_worker.cc: "Try killing all child processes of this worker as it exits", after the raylet's
death); one ended by a broken plasma-store connection (plasma's QuickExit) skips it, and the core,
its worker and their resource tracker (2.7 GB on CPU) lived on (chaos soak, docs/reliability.md;
with real vLLM, the raylet and the actor SIGKILLed: still alive 20 s later without this guard, gone
with it). PR_SET_PDEATHSIG cannot be set on a child from the parent, and vLLM starts it.

So, once the engine is up, the actor starts this guard: a small process of the standard library
only, holding the read end of a pipe whose write end only the actor holds (close-on-exec: no later
child inherits it). End of file there means the actor is gone, by any signal or exit: the guard
then ends the engine processes it was given (pid and start time: never a reused pid) and their
descendants, SIGTERM first (vLLM frees its shared memory), SIGKILL after a grace.

    python engine_guard.py PID:START ...
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
ENGINE_TITLE = "VLLM::"  # vLLM titles its processes VLLM::EngineCore, VLLM::Worker
REFRESH_S = 5.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live, non-zombie process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's: a child belongs to the thread that forked it)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def tree(roots: dict[int, int]) -> dict[int, int]:
    """pid -> start time of each root still that process, and of every live descendant of one."""
    out: dict[int, int] = {}
    todo = [pid for pid, started in roots.items() if (_stat(pid) or (0, -1))[1] == started]
    while todo:
        pid = todo.pop()
        st = _stat(pid)
        if st is not None and pid not in out:
            out[pid] = st[1]
            todo.extend(children(pid))
    return out


def end(procs: dict[int, int], grace_s: float = GRACE_S) -> None:
    def signal_all(sig: int) -> None:
        for pid, started in procs.items():
            if (_stat(pid) or (0, -1))[1] == started:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any((_stat(p) or (0, -1))[1] == s for p, s in procs.items()):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def start_guard() -> subprocess.Popen | None:
    """In the actor, once its engine has started: guard its vLLM child processes (the engine core;
    its workers are found under it). None when it has none (an in-process engine). Keep the
    returned handle for the actor's life: its stdin is the pipe whose end of file tells the guard the
    actor is gone (collected, it would close it and end the engine under a live actor)."""
    me = os.getpid()
    roots = {
        pid: st[1]
        for pid in children(me)
        if (st := _stat(pid)) is not None and st[0] == me and _cmdline(pid).startswith(ENGINE_TITLE)
    }
    if not roots:
        return None
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *(f"{pid}:{started}" for pid, started in roots.items())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        close_fds=True,
    )


def main(argv: list[str]) -> int:
    # Ctrl-C at a terminal reaches the whole process group: the driver then closes the actors,
    # whose deaths end this guard's wait like any other.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    known = {int(pid): int(started) for pid, started in (arg.split(":") for arg in argv)}
    fd = sys.stdin.fileno()
    while True:
        # Every few seconds the tree is read again, so that an engine worker whose core died first
        # (Ray's SIGKILL of the actor's children) is still known by then.
        known = tree(known)  # the live ones and their descendants: a dead pid is forgotten
        if select.select([fd], [], [], REFRESH_S)[0] and not os.read(fd, 4096):
            break  # end of file: the actor never writes, so only its death gets here
    end(tree(known))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
