"""The soak: a real `seal train` run (benchmarks/chaos/child.py) under a fault schedule
(benchmarks/chaos/schedule.py), restarted with `resume=RUN_DIR` whenever a fault ends it.

The run's storage (checkpoints, snapshot weights: ``trainer.storage``) is a tmpfs this process mounts
for the soak and removes after, so ``disk_full`` is a real full filesystem: a filler file leaves less
room than a checkpoint needs, and is removed when the run has stopped on it. The soak makes itself
the child subreaper (prctl), so whatever a dead driver leaves behind (Ray's processes, vLLM's engine
core) is re-parented to it: counted as left over, and ended by pid.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos import procs
from benchmarks.chaos.schedule import RUN_ENDING, Fault

REPO = Path(__file__).resolve().parents[2]
PR_SET_CHILD_SUBREAPER = 36
FILL_LEAVE_BYTES = 4 << 20  # a checkpoint of the tiny model is ~36 MB: 4 MB free fails it
FILL_GIVE_UP_S = 180.0  # a disk_full no write met by then is released (reported "not hit")
LEFTOVER_GRACE_S = 30.0  # after a driver's exit: what is still alive then is left over (and ended)


def base_overrides(run_dir: Path, storage: Path, chaos_dir: Path, replicas: int, checkpoint_every: int) -> list[str]:
    """The fastest real pipeline the integration tests run (tests/integration/test_pipeline.py), async,
    with two env actors, the fault-injecting engine and the storage on the soak's tmpfs."""
    return [
        "env=toy",
        "model=tiny",
        "learner=torch",
        "sampling.max_new_tokens=64",
        "n=4",
        "trainer.mode=async",
        "trainer.groups_per_step=1",
        "trainer.filter_groups=none",  # every group trains: the tiny model's rewards are mostly equal
        "trainer.oversample=0",
        "trainer.min_group_size=3",  # one faulted episode trains on the rest; two re-issue the group
        f"trainer.checkpoint_every={checkpoint_every}",
        "trainer.snapshot_every=0",
        f"trainer.storage={storage}",
        "evaluation.final=false",
        "cluster.env_actors=2",
        # A soak kills the same actor many times (in its tail always the youngest); the default budget
        # of 3 restarts per actor would end the run with ReplicaGone, tested on its own
        # (tests/unit/seal/runtime/test_replica_deaths.py): here every kill must be survived.
        "cluster.max_restarts=1000",
        f"generator.replicas={replicas}",
        "generator._target_=benchmarks.chaos.engine_faults.ChaosAsyncGenerator",
        f"+generator.chaos_dir={chaos_dir}",
        f"run_dir={run_dir}",
    ]


@dataclass
class Invocation:
    index: int
    resumed_from: int  # the checkpoint's step it started from (0: a fresh run)
    started_t: float
    log: Path
    popen: subprocess.Popen
    ended_t: float | None = None
    rc: int | None = None
    last_line: str = ""
    ended_by: str | None = None  # the run-ending fault it stopped on; None: its own end (or an unexpected one)
    leftovers: int = 0  # processes still alive LEFTOVER_GRACE_S after the driver's exit
    leftover_kinds: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "resumed_from": self.resumed_from,
            "seconds": round((self.ended_t or time.monotonic()) - self.started_t, 1),
            "rc": self.rc,
            "last_line": self.last_line,
            "ended_by": self.ended_by,
            "leftover_processes": self.leftovers,
            "leftover_kinds": self.leftover_kinds,
        }


@dataclass
class Soak:
    out: Path
    schedule: list[Fault]
    duration_s: float
    replicas: int = 1
    checkpoint_every: int = 5
    tmpfs_mb: int = 256
    final_steps: int = 3
    sample_every_s: float = 10.0
    extra_overrides: list[str] = field(default_factory=list)
    # True: end once every fault is injected and the run has trained ``settle_steps`` after the last
    # (the fixed one-of-each soak); False: run the whole duration.
    until_done: bool = False
    settle_steps: int = 3
    # Soak seconds from which faults that end the run are held back (None: never), and a kill strikes
    # the youngest process of its kind: the oldest of each kind lives through this tail, so its memory
    # growth over the tail is measured on one process (a restart would reset it).
    steady_from_s: float | None = None
    # what happened
    injected: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics rows as they appeared: t, invocation, row

    def __post_init__(self) -> None:
        self.run_dir = self.out / "run"
        self.mount = self.out / "storage"
        self.storage = self.mount / self.run_dir.name  # seal/runtime/storage.py run_storage
        self.chaos_dir = self.out / "triggers"
        self.trained = self.out / "trained.jsonl"
        self._metrics_offset = 0
        self.torn_rows = 0
        self._stopped: dict[int, tuple[procs.Proc, float]] = {}  # pid -> (process, SIGCONT time)
        self._filler: Path | None = None
        self._filled_t = 0.0
        self._tree: list[procs.Proc] = []
        self._step = 0

    # ------------------------------------------------------------ set-up
    def __enter__(self) -> Soak:
        for d in (self.out, self.mount, self.chaos_dir):
            d.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_mb}m", "seal-chaos", str(self.mount)], check=True
        )
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        inv = self.invocations[-1] if self.invocations else None
        if inv is not None and inv.rc is None:
            self._end_invocation(inv, kill=True)
        subprocess.run(["umount", "-l", str(self.mount)], check=False)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------ the run
    def checkpoint_step(self) -> int | None:
        meta = self.storage / "checkpoints" / "latest" / "learner.json"
        try:
            return int(json.loads(meta.read_text())["extra"]["step"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None

    def launch(self, steps: int) -> Invocation:
        resumed = self.checkpoint_step()
        overrides = base_overrides(self.run_dir, self.mount, self.chaos_dir, self.replicas, self.checkpoint_every)
        if resumed is not None:  # a resume keeps the run's own config; only the steps of this invocation change
            overrides = [f"resume={self.run_dir}", f"trainer.steps={steps}"]
        else:
            overrides += [f"trainer.steps={steps}", *self.extra_overrides]
        index = len(self.invocations)
        log = self.out / f"invocation{index}.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SEAL_CHAOS_TRAINED": str(self.trained),
            "SEAL_CHAOS_INVOCATION": str(index),
        }
        with open(log, "w") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.chaos.child", "train", *overrides],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        inv = Invocation(index, resumed or 0, time.monotonic(), log, popen)
        self.invocations.append(inv)
        self._tree = []
        return inv

    def _end_invocation(self, inv: Invocation, kill: bool = False) -> None:
        if kill and inv.popen.poll() is None:
            inv.ended_by = inv.ended_by or "soak_end"
            inv.popen.send_signal(signal.SIGINT)  # the driver closes its actors and Ray
            try:
                inv.popen.wait(120)
            except subprocess.TimeoutExpired:
                inv.popen.kill()
        inv.rc = inv.popen.wait()
        inv.ended_t = time.monotonic()
        lines = [line for line in inv.log.read_text(errors="replace").splitlines() if line.strip()]
        inv.last_line = lines[-1][:400] if lines else ""
        self._cont_all()
        left = self._orphans()
        deadline = time.monotonic() + LEFTOVER_GRACE_S  # Ray's own shutdown takes a few seconds
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            self._reap()
            left = self._orphans()
        inv.leftovers = len(left)
        inv.leftover_kinds = sorted({p.kind for p in left})
        for p in left:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap()
        self._release_disk()

    def _orphans(self) -> list[procs.Proc]:
        """Processes of an ended invocation still alive (re-parented to this subreaper), zombies aside."""
        return [p for p in procs.classify(os.getpid()) if p.pid != os.getpid() and not procs.zombie(p.pid)]

    def _reap(self) -> None:
        """Collect the exit status of orphans re-parented to this subreaper (never the Popen's child: its wait does)."""
        for p in procs.classify(os.getpid()):
            if p.pid != os.getpid():
                try:
                    os.waitpid(p.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    # ------------------------------------------------------------ watching
    def _read_rows(self, inv: Invocation) -> None:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        with open(path) as fh:
            fh.seek(self._metrics_offset)
            chunk = fh.read()
        whole = chunk[: chunk.rfind("\n") + 1]
        self._metrics_offset += len(whole.encode())
        for line in whole.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line a killed driver left half written, then the next appended to
                self.torn_rows += 1
                continue
            self._step = int(row["step"])
            self.rows.append({"t": round(self.now(), 1), "invocation": inv.index, "row": row})

    def _sample(self, inv: Invocation) -> None:
        """Every process of the run, once the invocation has trained a step (start-up is not growth)."""
        self._tree = procs.classify(inv.popen.pid)
        if self.steps_this_invocation(inv) == 0:
            return
        for p in self._tree:
            got = procs.sample(p.pid)
            if got is not None and p.kind != "ray":
                self.samples.append(
                    {
                        "t": round(self.now(), 1),
                        "invocation": inv.index,
                        "step": self._step,
                        "pid": p.pid,
                        "kind": p.kind,
                        **got,
                    }
                )

    def steps_this_invocation(self, inv: Invocation) -> int:
        return sum(1 for r in self.rows if r["invocation"] == inv.index)

    # ------------------------------------------------------------ faults
    def _targets(self, kind: str) -> list[procs.Proc]:
        want = kind.split("_")[0]
        return sorted(
            (p for p in self._tree if p.kind == want and procs.alive(p) and p.pid not in self._stopped),
            key=lambda p: p.pid,
        )

    def try_inject(self, fault: Fault, inv: Invocation) -> bool:
        """Inject ``fault`` into the running invocation; False: not now (its target is not up yet)."""
        if self.checkpoint_step() is None:
            return False  # before the first checkpoint no resume=RUN_DIR could follow
        if self.steps_this_invocation(inv) == 0:
            # Each invocation trains a step first. Faults queued over a restart otherwise all hit the next
            # start: a replica killed while the fleet starts fails the start (one line, see
            # docs/reliability.md), and the soak measured restarts, not recoveries.
            return False
        if fault.kind in RUN_ENDING and (inv.ended_by is not None or self.in_steady_tail()):
            return False
        detail: dict[str, Any] = {}
        if fault.kind.endswith(("_kill", "_stop")) and fault.kind != "driver_kill":
            targets = self._targets(fault.kind)
            if not targets:
                return False
            target = targets[min(int(fault.pick * len(targets)), len(targets) - 1)]
            if fault.kind.endswith("_kill") and self.in_steady_tail():
                target = targets[-1]  # the youngest (pids rise): the oldest outlives the tail
            if fault.kind.endswith("_kill"):
                os.kill(target.pid, signal.SIGKILL)
            else:
                os.kill(target.pid, signal.SIGSTOP)
                self._stopped[target.pid] = (target, time.monotonic() + fault.pause_s)
                detail["pause_s"] = fault.pause_s
            detail["pid"] = target.pid
        elif fault.kind in ("engine_error", "weight_round"):
            trigger = self.chaos_dir / f"{fault.kind}-{len(self.injected):04d}"
            trigger.write_text(f"{self.now():.1f}\n")
            detail["trigger"] = trigger.name
        elif fault.kind == "driver_kill":
            os.kill(inv.popen.pid, signal.SIGKILL)
            detail["pid"] = inv.popen.pid
        elif fault.kind == "disk_full":
            if self._filler is not None:
                return False
            detail["free_mb_before"] = round(self._fill() / 2**20, 1)
        if fault.kind in RUN_ENDING:
            inv.ended_by = fault.kind
        self.injected.append(
            {
                "t": round(self.now(), 1),
                "kind": fault.kind,
                "scheduled_s": fault.at_s,
                "invocation": inv.index,
                "step": self._step,
                **detail,
            }
        )
        return True

    def in_steady_tail(self) -> bool:
        return self.steady_from_s is not None and self.now() >= self.steady_from_s

    def _fill(self) -> int:
        stat = os.statvfs(self.mount)
        free = stat.f_bavail * stat.f_frsize
        self._filler = self.mount / "chaos-filler"
        with open(self._filler, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, max(0, free - FILL_LEAVE_BYTES))
        self._filled_t = time.monotonic()
        return free

    def _release_disk(self) -> None:
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
            self._filler = None

    def _cont_due(self, all_now: bool = False) -> None:
        for pid, (p, when) in list(self._stopped.items()):
            if all_now or time.monotonic() >= when:
                if procs.alive(p):
                    os.kill(pid, signal.SIGCONT)
                del self._stopped[pid]

    def _cont_all(self) -> None:
        self._cont_due(all_now=True)

    # ------------------------------------------------------------ the loop
    def _inject_one(self, pending: list[Fault], inv: Invocation, clock: float) -> None:
        """The first due fault that can go in now (a run-ending one waits for the invocation's first
        step, any waits for its target to be up; the ones behind it need not wait for it)."""
        for i, fault in enumerate(pending):
            if fault.at_s > clock:
                return
            if self.try_inject(fault, inv):
                pending.pop(i)
                return

    def settled(self, pending: list[Fault]) -> bool:
        if not self.until_done or pending:
            return False
        last = self.injected[-1]["t"] if self.injected else 0.0
        return sum(r["t"] > last and r["row"].get("trained_groups", 0) > 0 for r in self.rows) >= self.settle_steps

    def run(self, steps_per_invocation: int = 1_000_000, tick_s: float = 0.5) -> None:
        """Faults come at their times counted from the run's first checkpoint (before it no resume can follow)."""
        pending = sorted(self.schedule, key=lambda f: f.at_s)
        inv = self.launch(steps_per_invocation)
        next_sample = next_tree = 0.0
        clock0: float | None = None
        while self.now() < self.duration_s and not self.settled(pending):
            if inv.popen.poll() is not None:
                self._read_rows(inv)
                self._end_invocation(inv)
                inv = self.launch(steps_per_invocation)
                next_sample = 0.0
                continue
            self._read_rows(inv)
            if self.now() >= next_sample:
                self._sample(inv)
                next_sample = self.now() + self.sample_every_s
            elif self.now() >= next_tree:
                self._tree = procs.classify(inv.popen.pid)  # targets: a restarted actor has a new pid
                next_tree = self.now() + 2.0
            self._cont_due()
            if self._filler is not None and time.monotonic() - self._filled_t > FILL_GIVE_UP_S:
                [*_, last] = (f for f in self.injected if f["kind"] == "disk_full")
                last["not_hit"] = True  # no write met the full disk in time: released, the run goes on
                inv.ended_by = None
                self._release_disk()
            if clock0 is None and self.checkpoint_step() is not None:
                clock0 = self.now()
            if clock0 is not None:
                self._inject_one(pending, inv, self.now() - clock0)
            time.sleep(tick_s)
        self.not_injected = [f.to_dict() for f in pending]
        # The end: the last invocation stopped, then one more resumes and finishes on its own, closing the books.
        self._read_rows(inv)
        self._end_invocation(inv, kill=True)
        final = self.launch(self.final_steps)
        while final.popen.poll() is None:
            self._read_rows(final)
            if self.now() >= next_sample:
                self._sample(final)
                next_sample = self.now() + self.sample_every_s
            time.sleep(tick_s)
        self._read_rows(final)
        self._end_invocation(final)
