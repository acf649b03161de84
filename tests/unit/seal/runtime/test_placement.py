"""Placement (the `cluster` config group): CPU lists, pinning, early errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from seal.cluster_config import ActorResources, ClusterConfig, parse_cpu_list


def test_cpu_lists_parse_like_linux():
    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("1") == {1}
    assert parse_cpu_list("0-3,8") == {0, 1, 2, 3, 8}
    assert parse_cpu_list(" 2 , 2-3 ") == {2, 3}


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-1", "1;2", "0-2-4"])
def test_bad_cpu_lists_name_the_bad_part(bad):
    with pytest.raises(ValueError, match="bad CPU list"):
        ActorResources(cpus=bad)


def test_pinned_cores_set_the_thread_count_unless_given():
    assert ActorResources(cpus=1).cpus == "1"  # an int from the command line
    assert ActorResources(cpus="0-2").thread_count() == 3
    assert ActorResources(cpus="0-2", threads=1).env_vars() == {"OMP_NUM_THREADS": "1"}
    assert ActorResources(cpus="3", threads=2).thread_count() == 1  # never more threads than pinned cores
    assert ActorResources().env_vars() == {} and ActorResources().thread_count() == 0


def test_unpinned_factory_is_left_as_it_is():
    factory = dict
    assert ActorResources().pinned(factory) is factory


# A child process: pinning must cover a thread that was running before it and
# every thread started after it, and the factory's result comes back.
CHILD = """
import json, os, threading
from seal.cluster_config import ActorResources
stop = threading.Event()
early = threading.Thread(target=stop.wait); early.start()
build = ActorResources(cpus="{cpu}").pinned(lambda: "built")
result = build()
late = threading.Thread(target=stop.wait); late.start()
allowed = set()
tids = os.listdir("/proc/self/task")  # counted while both threads still wait (after stop.set() they may be gone)
for tid in tids:
    allowed.add(",".join(map(str, sorted(os.sched_getaffinity(int(tid))))))
stop.set()
print(json.dumps({{"result": result, "allowed": sorted(allowed), "threads": len(tids)}}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: every thread is on it pinned or not")
def test_pinning_covers_threads_started_before_and_after():
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(cpu=cpu)], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(out.stdout)
    assert report["result"] == "built" and report["allowed"] == [str(cpu)] and report["threads"] >= 3


def test_cores_this_machine_lacks_are_refused_early_and_in_the_actor():
    missing = max(os.sched_getaffinity(0)) + 1000
    cfg = ClusterConfig(learner={"cpus": str(missing)})
    with pytest.raises(ValueError, match=rf"cluster.learner.cpus='{missing}' names CPUs \[{missing}\]"):
        cfg.check_local_cpus()
    with pytest.raises(ValueError, match="not available on this node"):
        ActorResources(cpus=str(missing)).pinned(dict)()


def test_a_local_start_refuses_gpus_and_custom_resources_it_does_not_have():
    cfg = ClusterConfig(env_actors=3, env_actor={"num_gpus": 0.5}, learner={"num_gpus": 1})
    with pytest.raises(
        ValueError,
        match=r"ask for 2.5 GPUs \(cluster.env_actor.num_gpus=0.5 x 3 env actors, "
        r"cluster.learner.num_gpus=1\) but a local Ray start here has 2",
    ):
        cfg.check_local_resources(gpus=lambda: 2)
    cfg.check_local_resources(gpus=lambda: 3)
    cfg.check_local_resources(gpus=lambda: None)  # a Ray that does not say: nothing refused
    asked = []
    ClusterConfig().check_local_resources(gpus=lambda: asked.append(1) or 0)
    assert asked == []  # no GPU asked for: no detection (it imports Ray)
    with pytest.raises(
        ValueError, match="cluster.generator.resources asks for big_node, which a local Ray start does not have"
    ):
        ClusterConfig(generator={"resources": {"big_node": 1}}).check_local_resources(gpus=lambda: 0)
    ClusterConfig(generator={"resources": {"node:__internal_head__": 0.1}}).check_local_resources(gpus=lambda: 0)


def _node(node_id: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


def test_least_used_node_spreads_replicas_over_the_nodes_that_can_hold_them():
    from seal.runtime.placement import least_used_node

    nodes = [
        _node("b", CPU=4),
        _node("a", CPU=4),
        _node("gpu", CPU=8, GPU=8),
        _node("dead", alive=False, CPU=64, GPU=8),
    ]
    cpu = {"CPU": 1.0, "GPU": 0.0}
    # A tie goes to the preferred (driver's) node, else the first by id; then the emptiest node.
    assert least_used_node(nodes, cpu, {}, prefer="b") == "b"
    assert least_used_node(nodes, cpu, {}) == "a"
    assert least_used_node(nodes, cpu, {"b": 1}, prefer="b") == "a"
    assert least_used_node(nodes, cpu, {"a": 1, "b": 1, "gpu": 0}, prefer="b") == "gpu"
    # Only nodes whose resources can hold the ask count; one such node leaves it to Ray.
    assert least_used_node(nodes, {"CPU": 1.0, "GPU": 4.0}, {}) is None
    assert least_used_node(nodes, {"CPU": 1.0, "generator_slot": 1.0}, {}) is None
    slots = [_node("h", CPU=4, generator_slot=1), _node("w", CPU=4, generator_slot=1), _node("x", CPU=4)]
    assert least_used_node(slots, {"CPU": 1.0, "generator_slot": 1.0}, {"h": 1}) == "w"
