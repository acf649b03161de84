"""The soak's process census (benchmarks/chaos/procs.py) on real processes: a tree of sleepers titled
as Ray titles its actors' workers (``exec -a``), read from /proc."""

from __future__ import annotations

import os
import subprocess
import time

from benchmarks.chaos.procs import alive, classify, descendants, sample, zombie


def tree(tmp_path) -> list[str]:
    """A driver with an env actor, a replica (its engine core, the core's worker), a learner and a raylet."""
    engine = tmp_path / "engine.sh"
    engine.write_text("(exec -a VLLM::Worker sleep 300) & wait\n")
    replica = tmp_path / "replica.sh"
    replica.write_text(f"(exec -a VLLM::EngineCore bash {engine}) & wait\n")
    driver = tmp_path / "driver.sh"
    driver.write_text(
        "(exec -a ray::EnvActor.run_group sleep 300) &\n"
        f"(exec -a ray::ChaosAsyncGenerator.generate bash {replica}) &\n"
        "(exec -a ray::LearnerRank sleep 300) &\n"
        "(exec -a raylet sleep 300) &\n"
        "wait\n"
    )
    return ["bash", str(driver)]


def test_the_run_s_processes_are_found_by_kind_and_read(tmp_path):
    root = subprocess.Popen(tree(tmp_path))
    try:
        deadline, kinds = time.monotonic() + 30, []
        while len(kinds) < 6 and time.monotonic() < deadline:  # bash forks, then execs: titles come late
            time.sleep(0.1)
            found = classify(root.pid)
            kinds = sorted(p.kind for p in found if p.kind != "ray")
        assert kinds == ["driver", "env", "generator", "generator_engine", "generator_worker", "learner"], found
        env = next(p for p in found if p.kind == "env")
        got = sample(env.pid)
        assert got is not None and got["rss_kb"] > 0 and got["fds"] >= 3 and got["threads"] == 1
        assert alive(env) and not zombie(env.pid)
    finally:
        for pid in sorted(descendants(root.pid), reverse=True):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:  # a shell that ended with its child
                pass
        root.wait()
    deadline = time.monotonic() + 10  # SIGKILL is delivered, not done, when os.kill returns
    while alive(env) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(env)
