"""Several raylets on one machine (ray.cluster_utils.Cluster): env actors
spread over the nodes and the pipeline trains across them. `slow`: the real
two-host test (test_two_hosts.py, separate addresses) covers this and more in
the default run; this one stays for machines without network namespaces."""

from __future__ import annotations

import os

import pytest

from seal.config import compose
from seal.run.run_dir import create_run_dir


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    c = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={"num_cpus": 4, "include_dashboard": False, "object_store_memory": 2 * 2**30},
    )
    for _ in range(2):
        c.add_node(num_cpus=2, object_store_memory=2**30)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.slow
def test_env_actors_spread_over_nodes_and_training_runs(tmp_path, cluster):
    import ray

    from seal.run.pipeline import Pipeline

    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    args = [
        "env=toy",
        "model=tiny",
        "learner=torch",
        "sampling.max_new_tokens=32",
        "cluster.env_actors=3",
        f"cluster.address={cluster.address}",
        "trainer.mode=async",
        "trainer.groups_per_step=2",
        "trainer.filter_groups=none",
        "trainer.oversample=0",
    ]  # the tiny model's groups all have equal rewards; this test counts them
    cfg = compose(args)
    p = Pipeline(cfg, create_run_dir(str(tmp_path), cfg, args))
    try:
        nodes = ray.get([h.node_id.remote() for h in p.actors.env.values()])
        rows = p.run(2)
    finally:
        p.close()
    assert len(set(nodes)) >= 2, nodes
    assert [r["step"] for r in rows] == [1, 2] and p.ledger.counters.consumed == 4
    assert ray.is_initialized()  # the pipeline leaves a cluster it joined running
