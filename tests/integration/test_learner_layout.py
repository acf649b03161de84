"""qwen7b_2x8's placement on a two-node Ray cluster of logical GPUs (issue 26, finding 7): two
raylets on this machine, each declaring 8 GPUs, the recipe's own actor resources, and light actors
in place of the engines (placement needs no model). The replicas' node choice is the fleet's own
(``spread_choice``); the learner's bundles are what ``LearnerGroup`` places its ranks in.

The old order (replicas first, then a PACK group for the ranks) splits the 8 ranks 4 + 4, and the
guard names it; the new order (the plan's layout reserved first, STRICT_PACK) keeps them on one node
and the replicas on the other."""

from __future__ import annotations

import os
import time

import pytest

from seal.config import compose, instantiate
from seal.runtime.layout_guard import (
    LayoutError,
    check_learner_nodes,
    check_replicas_fit,
    planned_learner_nodes,
    reserve_learner,
    reserved_per_node,
)

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # 40 logical CPUs a node: the recipe's 8 ranks x 4 + 2 replicas x 4 fit on one; the processes are light.
    c = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={"num_cpus": 40, "num_gpus": 8, "include_dashboard": False, "object_store_memory": 2**30},
    )
    c.add_node(num_cpus=40, num_gpus=8, object_store_memory=2**30)
    c.wait_for_nodes()
    # ray.nodes() can lag the registration on a loaded machine: a node missing there is one the fleet's
    # node choice cannot see (both replicas then went to the head, seen in a fresh-clone run).
    deadline = time.monotonic() + TIMEOUT_S
    while sum(1 for n in ray.nodes() if n["Alive"] and n.get("Resources", {}).get("GPU") == 8) < 2:
        assert time.monotonic() < deadline, ray.nodes()
        time.sleep(0.5)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def recipe():
    cfg = compose(["recipe=qwen7b_2x8"])
    return instantiate(cfg.cluster), int(cfg.learner.world_size), int(cfg.generator.replicas)


def _probe_class():
    import ray

    @ray.remote
    class Probe:
        """Stands where a replica or a rank would: it only says which node it landed on."""

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    return Probe


def _start_replicas(resources, count: int, reserved: dict) -> list:
    """What GeneratorFleet._start does to place each replica, with a probe for the engine."""
    from seal.runtime.layout_guard import spread_choice

    probe, handles, chosen = _probe_class(), {}, {}
    for i in range(count):
        name = f"generator-{i}"
        options = resources.ray_options()
        node, strategy = spread_choice(handles, chosen, resources.bundle(), reserved)
        if node is not None:
            options["scheduling_strategy"] = strategy
            chosen[name] = node
        handles[name] = probe.options(**options).remote()
    return list(handles.values())


def _ranks_in(pg, resources, world_size: int) -> list:
    """What LearnerGroup does with its placement group: rank r in bundle r."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probe = _probe_class()
    return [
        probe.options(
            **resources.ray_options(),
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
        ).remote()
        for r in range(world_size)
    ]


def _nodes(handles) -> list[str]:
    import ray

    return ray.get([h.node.remote() for h in handles], timeout=TIMEOUT_S)


def _release(handles, pg) -> None:
    import ray

    for h in handles:
        ray.kill(h)
    ray.util.remove_placement_group(pg)


def test_replicas_first_split_the_ranks_and_the_guard_names_it(cluster, recipe):
    """The old ActorSet order: replicas spread one per node, then a PACK group for 8 ranks finds
    4 GPUs free on each node. (The old code did not wait for the replicas to be placed before
    making the group; placement takes milliseconds, the learner's start more, so this is the usual
    order there, and here it is made certain.)"""
    import ray
    from ray.util.placement_group import placement_group

    res, world, replicas = recipe
    planned = planned_learner_nodes(res.generator, res.learner, replicas, world, ray.nodes())
    assert planned == (8,)
    gens = _start_replicas(res.generator, replicas, reserved={})
    assert len(set(_nodes(gens))) == 2
    pg = placement_group([{k: v for k, v in res.learner.bundle().items() if v}] * world, strategy="PACK")
    assert pg.wait(TIMEOUT_S)
    ranks = _ranks_in(pg, res.learner, world)
    try:
        landed = _nodes(ranks)
        assert sorted(landed.count(n) for n in set(landed)) == [4, 4]
        with pytest.raises(
            LayoutError,
            match=r"^learner ranks landed 4 \+ 4 over 2 nodes .* but seal plan puts them "
            r"on one node \(8\): ZeRO-3's gathers would cross nodes$",
        ):
            check_learner_nodes(planned, landed)
    finally:
        _release(gens + ranks, pg)


def test_the_plan_reserved_first_keeps_the_ranks_on_one_node(cluster, recipe):
    import ray

    res, world, replicas = recipe
    planned = planned_learner_nodes(res.generator, res.learner, replicas, world, ray.nodes())
    pg = reserve_learner(res.learner, world, planned, TIMEOUT_S)
    reserved = reserved_per_node(pg)
    assert [v["GPU"] for v in reserved.values()] == [8.0]  # STRICT_PACK: one node holds every bundle
    check_replicas_fit(res.generator, replicas, ray.nodes(), reserved)
    gens = _start_replicas(res.generator, replicas, reserved)
    ranks = _ranks_in(pg, res.learner, world)
    try:
        landed, gen_nodes = _nodes(ranks), _nodes(gens)
        check_learner_nodes(planned, landed)
        assert len(set(landed)) == 1 and set(landed) == set(reserved)
        assert len(set(gen_nodes)) == 1 and not set(gen_nodes) & set(landed)  # both replicas on the other node
        # A third TP-4 replica has no room beside the reservation: refused in one line, not left waiting.
        with pytest.raises(LayoutError, match="1 of 3 generator replicas of 4 CPU, 4 GPU each cannot be placed"):
            check_replicas_fit(res.generator, 3, ray.nodes(), reserved)
    finally:
        _release(gens + ranks, pg)


def test_a_layout_the_cluster_cannot_give_is_refused(cluster, recipe):
    """Nine ranks of one GPU on nodes of eight: the plan packs them 8 + 1, so the group is PACK;
    asked to keep all nine on one node (STRICT_PACK), Ray cannot, and the reservation says so."""
    import ray

    res, _, replicas = recipe
    assert planned_learner_nodes(res.generator, res.learner, 0, 9, ray.nodes()) == (8, 1)
    with pytest.raises(
        LayoutError,
        match=r"cannot place 9 learner ranks of 4 CPU, 1 GPU each on one node "
        r"\(where seal plan puts them\) within 5s",
    ):
        reserve_learner(res.learner, 9, (9,), timeout_s=5)


def test_nodes_sharing_an_ip_each_pass_the_storage_check(cluster, tmp_path):
    """Both raylets here have one IP (as a rehearsal's logical nodes do): each node's storage probe
    must be a file of its own (the probes were named by IP alone, so the driver removed the first
    and found the second gone: "wrote its probe ... but the driver cannot read it")."""
    import ray

    from seal.runtime.storage import check_nodes_see

    nodes = {n["NodeID"]: f"node {i}" for i, n in enumerate(ray.nodes()) if n["Alive"]}
    assert len(nodes) == 2 and len({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}) == 1
    for _ in range(3):  # the old names failed whenever both probes were written before the first was read
        check_nodes_see(tmp_path, nodes, timeout_s=TIMEOUT_S)
    assert not (tmp_path / ".seal-probe").exists()
