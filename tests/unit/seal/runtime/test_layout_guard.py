"""The layout guard (seal/runtime/layout_guard.py) without Ray: the plan's learner layout on a cluster's
nodes, the one-line refusals, object-store sizes; and the preflight's GPU and object-store counts
(issue 26, findings 7 and 9). The same on a two-node Ray cluster: tests/integration/test_learner_layout.py."""

from __future__ import annotations

import os

import pytest

from seal.cluster_config import ActorResources, ClusterConfig
from seal.runtime.layout_guard import (
    LayoutError,
    check_learner_nodes,
    check_local_object_store,
    check_object_stores,
    check_replicas_fit,
    free_nodes,
    planned_learner_nodes,
)
from seal.runtime.placement import least_used_node

GEN_TP4 = ActorResources(num_cpus=4, num_gpus=4)  # qwen7b_2x8's cluster.generator
RANK = ActorResources(num_cpus=4, num_gpus=1)  # its cluster.learner


def _node(node_id: str, gpus: float, cpus: float = 96, store_gb: float = 100) -> dict:
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": f"10.0.0.{node_id[-1]}",
        "Resources": {
            "CPU": cpus,
            "GPU": gpus,
            "memory": 500e9,
            "object_store_memory": store_gb * 1e9,
            f"node:10.0.0.{node_id[-1]}": 1.0,
        },
    }


TWO_BY_EIGHT = [_node("node1", 8), _node("node2", 8)]


def test_the_plan_puts_qwen7b_2x8s_ranks_on_one_node():
    assert planned_learner_nodes(GEN_TP4, RANK, 2, 8, TWO_BY_EIGHT) == (8,)
    assert planned_learner_nodes(GEN_TP4, RANK, 1, 12, TWO_BY_EIGHT) == (8, 4)  # more ranks than a node holds: PACK
    assert planned_learner_nodes(GEN_TP4, RANK, 1, 6, [_node("node1", 8)]) == (
        4,
    )  # 4 GPUs left for 6 ranks: 2 unplaced


def test_a_layout_that_spans_nodes_on_purpose_stays_allowed():
    """One learner slot a node (the two-host tests: one rank per host): the plan spans both, so
    the group is PACK and ranks 1 + 1 over two nodes are what the plan states."""
    slot = ActorResources(num_cpus=1, resources={"learner_slot": 1})
    nodes = [_node("node1", 0, cpus=4), _node("node2", 0, cpus=4)]
    for n in nodes:
        n["Resources"]["learner_slot"] = 1.0
    planned = planned_learner_nodes(ActorResources(num_cpus=1), slot, 2, 2, nodes)
    assert planned == (1, 1)
    check_learner_nodes(planned, ["node1", "node2"])


def test_ranks_split_against_the_plan_are_refused_in_one_line():
    check_learner_nodes((8,), ["a"] * 8)
    check_learner_nodes((8, 4), ["a"] * 8 + ["b"] * 4)
    check_learner_nodes((8, 4), ["a"] * 12)  # fewer nodes than the plan: nothing crosses more than it says
    with pytest.raises(LayoutError) as err:
        check_learner_nodes((8,), ["a"] * 4 + ["b"] * 4, {"a": "10.0.0.1 (aaaa)", "b": "10.0.0.2 (bbbb)"})
    assert str(err.value) == (
        "learner ranks landed 4 + 4 over 2 nodes (10.0.0.1 (aaaa): ranks 0-3; 10.0.0.2 (bbbb): "
        "ranks 4-7) but seal plan puts them on one node (8): ZeRO-3's gathers would cross nodes"
    )
    assert "\n" not in str(err.value)


def test_replicas_must_fit_beside_the_learner_reservation():
    reserved = {"node1": {"CPU": 32.0, "GPU": 8.0}}
    check_replicas_fit(GEN_TP4, 2, TWO_BY_EIGHT, reserved)
    with pytest.raises(
        LayoutError,
        match=r"1 of 3 generator replicas of 4 CPU, 4 GPU each cannot be placed beside "
        r"the learner ranks' reservation \(free: 10.0.0.1 \(node1\): 64 CPU, 0 GPU; "
        r"10.0.0.2 \(node2\): 96 CPU, 8 GPU\)",
    ):
        check_replicas_fit(GEN_TP4, 3, TWO_BY_EIGHT, reserved)


def test_replica_spread_leaves_the_reserved_node_alone():
    """The learner's 8 GPUs on node1 leave only node2 for replicas: the choice goes to Ray (which
    can only place them there), never a soft affinity to node1, where Ray would queue it for ever."""
    free = free_nodes(TWO_BY_EIGHT, {"node1": {"CPU": 32.0, "GPU": 8.0}})
    assert [n["Resources"]["GPU"] for n in free] == [0.0, 8.0]
    ask = GEN_TP4.bundle()
    assert least_used_node(free, ask, {}, prefer="node1") is None
    assert least_used_node(TWO_BY_EIGHT, ask, {}, prefer="node1") == "node1"  # no reservation: the driver's node first
    # A node already holding as many replicas as it has room for is not chosen again.
    assert least_used_node(TWO_BY_EIGHT, ask, {"node1": 2}, prefer="node1") == "node2"
    assert least_used_node(TWO_BY_EIGHT, ask, {"node1": 2, "node2": 2}) is None


def test_object_stores_must_hold_the_generators_weights():
    seven_b = 15.2e9
    check_local_object_store(24, seven_b, "qwen2.5-7b-instruct in bfloat16")
    with pytest.raises(
        ValueError,
        match=r"cluster.object_store_gb=4 cannot hold the generator's weights \(15.2 GB: "
        r"qwen2.5-7b-instruct in bfloat16\).* set cluster.object_store_gb=16 or more",
    ):
        check_local_object_store(4, seven_b, "qwen2.5-7b-instruct in bfloat16")
    nodes = [_node("node1", 8, store_gb=300), _node("node2", 8, store_gb=4)]
    check_object_stores(nodes, {"node1": "learner ranks 0-7"}, seven_b, "7B")
    with pytest.raises(
        LayoutError,
        match=r"node 10.0.0.2 \(node2\) \(generator-0\) has a 4.0 GB object store.*"
        r"ray start --object-store-memory=17000000000",
    ):
        check_object_stores(nodes, {"node1": "learner ranks 0-7", "node2": "generator-0"}, seven_b, "7B")


def test_a_local_start_counts_every_learner_rank_and_replica():
    cfg = ClusterConfig(learner={"num_gpus": 1}, generator={"num_gpus": 2})
    with pytest.raises(
        ValueError,
        match=r"ask for 10 GPUs \(cluster.generator.num_gpus=2 x 2 generator replicas, "
        r"cluster.learner.num_gpus=1 x 6 learner ranks\) but a local Ray start here has 8",
    ):
        cfg.check_local_resources(gpus=lambda: 8, learner_ranks=6, replicas=2)
    cfg.check_local_resources(gpus=lambda: 10, learner_ranks=6, replicas=2)
    # Logical CPUs likewise: 4 ranks x 16 + 2 replicas x 16 + 2 env actors x 0.5 = 97, and 2 to spare.
    big = ClusterConfig(learner={"num_cpus": 16}, generator={"num_cpus": 16})
    assert big.local_cpus(learner_ranks=4, replicas=2) == max(os.cpu_count() or 1, 99)


def test_preflight_counts_world_size_gpus_and_sizes_the_object_store():
    """qwen7b_1x8 asks 6 ranks x 1 GPU + one TP-2 replica = 8 GPUs: on 4 it is refused (the old
    count was 1 + 2 = 3 and let it start, its ranks then waiting for GPUs for ever)."""
    from seal.commands.preflight import _check_cluster
    from seal.config import Settings, compose

    cfg = compose(["recipe=qwen7b_1x8"])
    with pytest.raises(ValueError, match=r"ask for 8 GPUs .*cluster.learner.num_gpus=1 x 6 learner ranks"):
        _check_cluster(cfg, Settings.of(cfg), gpus=lambda: 4)
    _check_cluster(cfg, Settings.of(cfg), gpus=lambda: 8)
    small = compose(["recipe=qwen7b_1x8", "cluster.object_store_gb=4"])
    with pytest.raises(ValueError, match="cluster.object_store_gb=4 cannot hold"):
        _check_cluster(small, Settings.of(small), gpus=lambda: 8)


@pytest.mark.parametrize("recipe", ["qwen3b_1x4", "qwen7b_1x8", "qwen7b_2x8"])
def test_every_recipes_object_store_holds_its_weights(recipe):
    from seal.config import Settings, compose, instantiate
    from seal.runtime.layout_guard import weights_bytes

    cfg = compose([f"recipe={recipe}"])
    check_local_object_store(instantiate(cfg.cluster).object_store_gb, *weights_bytes(Settings.of(cfg)))
