"""The soak's processes: found under the `seal train` process it started (the driver starts Ray, so
Ray's gcs, raylet and every actor's worker are its descendants; Ray titles an actor's worker
``ray::<Class>``), and read from /proc: resident memory, open descriptors, threads."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Ray's process title of each actor kind the soak follows (a worker's title also names its current call).
ACTOR_KINDS = {
    "ray::EnvActor": "env",
    "ray::ChaosAsyncGenerator": "generator",
    "ray::AsyncVllmGenerator": "generator",
    "ray::LearnerRank": "learner",
    "ray::CoordinatorService": "coordinator",
}


@dataclass(frozen=True)
class Proc:
    pid: int
    kind: str  # driver, env, generator, generator_engine, generator_worker, learner, coordinator, ray
    started: int  # clock ticks after boot (/proc/PID/stat field 22): a pid reused later is another process


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[1]), int(rest[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of ``root`` and every live descendant."""
    parent: dict[int, int] = {}
    started: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                parent[int(name)], started[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in started:
            out[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return out


def classify(root: int) -> list[Proc]:
    """Every process of the run, by kind; the generator's engine core is its replica's child (vLLM
    titles it VLLM::EngineCore), the engine's workers are the core's children (VLLM::Worker)."""
    tree = descendants(root)
    found: list[Proc] = []
    generators: set[int] = set()
    for pid, started in tree.items():
        if pid == root:
            found.append(Proc(pid, "driver", started))
            continue
        cmd = (_read(f"/proc/{pid}/cmdline") or "").split("\0")[0]
        kind = next((k for title, k in ACTOR_KINDS.items() if cmd.startswith(title)), "ray")
        if kind == "generator":
            generators.add(pid)
        found.append(Proc(pid, kind, started))
    out = []
    engines: set[int] = set()
    for p in found:  # the replica's engine core: its child, titled VLLM::EngineCore once it runs
        st = _stat(p.pid)
        cmd = _read(f"/proc/{p.pid}/cmdline") or ""
        if p.kind == "ray" and st is not None and st[0] in generators and cmd.startswith("VLLM::"):
            p = Proc(p.pid, "generator_engine", p.started)
            engines.add(p.pid)
        out.append(p)
    # The engine core's own workers (VLLM::Worker: the model and the KV cache live there).
    return [
        Proc(p.pid, "generator_worker", p.started)
        if p.kind == "ray"
        and (_stat(p.pid) or (0, 0))[0] in engines
        and (_read(f"/proc/{p.pid}/cmdline") or "").startswith("VLLM::")
        else p
        for p in out
    ]


def sample(pid: int) -> dict[str, int] | None:
    """Resident memory (KiB), open descriptors and threads of a live process; None once it is gone."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return {
        "rss_kb": int(fields.get("VmRSS", "0 kB").split()[0]),
        "fds": fds,
        "threads": int(fields.get("Threads", "0").strip()),
    }


def zombie(pid: int) -> bool:
    text = _read(f"/proc/{pid}/stat")
    return text is None or text.rsplit(")", 1)[1].split()[0] == "Z"


def alive(p: Proc) -> bool:
    """The same process (pid and start time), not yet dead: a zombie is dead, since a killed
    child whose parent died too waits for a reaper that a container's pid 1 may never be."""
    st = _stat(p.pid)
    return st is not None and st[1] == p.started and not zombie(p.pid)
