"""The soak's process census (benchmarks/chaos/procs.py) on real processes: a tree of sleepers titled
as Ray titles its actors' workers (``exec -a``), read from /proc."""

from __future__ import annotations

import os
import subprocess
import time

from benchmarks.chaos.procs import alive, classify, descendants, sample, zombie

TREE = """
(exec -a 'ray::EnvActor.run_group' sleep 300) &
(exec -a 'ray::ChaosAsyncGenerator.generate' bash -c "(exec -a 'python -c spawn_main' sleep 300) & wait") &
(exec -a 'ray::LearnerRank' sleep 300) &
(exec -a raylet sleep 300) &
wait
"""


def test_the_run_s_processes_are_found_by_kind_and_read():
    root = subprocess.Popen(["bash", "-c", TREE])
    try:
        deadline, kinds = time.monotonic() + 30, []
        while len(kinds) < 5 and time.monotonic() < deadline:  # bash forks, then execs: titles come late
            time.sleep(0.1)
            found = classify(root.pid)
            kinds = sorted(p.kind for p in found if p.kind != "ray")
        assert kinds == ["driver", "env", "generator", "generator_engine", "learner"], found
        env = next(p for p in found if p.kind == "env")
        got = sample(env.pid)
        assert got is not None and got["rss_kb"] > 0 and got["fds"] >= 3 and got["threads"] == 1
        assert alive(env) and not zombie(env.pid)
    finally:
        for pid in sorted(descendants(root.pid), reverse=True):
            os.kill(pid, 9)
        root.wait()
    assert not alive(env) and sample(env.pid) is None
