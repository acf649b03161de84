"""The run's actors land where `seal plan` puts them, or the run stops with one line.

`seal plan` (seal/estimate/plan_layout.py) packs the learner ranks onto as few nodes as hold them once the
generator replicas are placed, and a recipe's figures assume that layout: qwen7b_2x8's 8 ranks on
one node, where ZeRO-3's gathers stay on NVLink. Ray decides at run time, and the order matters:
with the replicas started first and spread over both nodes, a PACK placement group for 8 ranks of
one GPU found 4 GPUs free on each node and split the ranks 4 + 4 (issue 26). So the driver
(seal/runtime/actor_set.py):

1. works out the plan's learner layout on the cluster's own nodes (``planned_learner_nodes``);
2. reserves the ranks' bundles before anything else starts, STRICT_PACK when the plan puts them
   on one node, so Ray must keep them together or refuse (``reserve_learner``);
3. checks that the replicas fit beside that reservation (``check_replicas_fit``): a replica that
   cannot be placed would otherwise wait for its resources for ever;
4. after the ranks start, compares their nodes with the plan (``check_learner_nodes``).

Also here: the node for one more generator replica beside that reservation (``spread_choice``), and
whether an object store can hold the generator's weights (``weights_bytes``), which a
replica's restore and every object-store publish put in it whole (weights/buckets.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal.cluster_config import ActorResources
from seal.config import Settings
from seal.estimate.memory import DTYPE_BYTES, ModelSpec
from seal.estimate.plan import generator_setup, model_config
from seal.estimate.plan_layout import Demand, nodes_from_ray, place
from seal.runtime.placement import actor_nodes, least_used_node

# An object store must hold one copy of the generator's weights and a margin: batches, tag weights,
# Ray's own objects (a fuller store spills to disk: slow, and it can fill the disk).
OBJECT_STORE_MARGIN, OBJECT_STORE_SPARE_BYTES = 1.1, 0.25e9


class LayoutError(RuntimeError):
    """The cluster cannot give, or did not give, the layout `seal plan` states."""


def _bundle(res: ActorResources) -> dict[str, float]:
    return {k: v for k, v in res.bundle().items() if v}


def _ask(bundle: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items())


def planned_learner_nodes(
    generator: ActorResources,
    learner: ActorResources,
    replicas: int,
    world_size: int,
    ray_nodes: Sequence[Mapping[str, Any]],
) -> tuple[int, ...]:
    """Learner ranks per node, most first, as `seal plan` places them on these nodes (``ray.nodes()``):
    (8,) is one node holding all 8. Ranks the plan cannot place at all are left out."""
    demands = [Demand("generator", i, generator.bundle()) for i in range(replicas)] + [
        Demand("learner", r, learner.bundle()) for r in range(world_size)
    ]
    layout = place(demands, nodes_from_ray(ray_nodes), check_custom=True)
    counts = sorted((sum(d.role == "learner" for d in n.placed) for n in layout.nodes), reverse=True)
    return tuple(c for c in counts if c)


def reserve_learner(resources: ActorResources, world_size: int, planned: tuple[int, ...], timeout_s: float) -> Any:
    """The ranks' placement group, made and placed before any other actor of the run (None: the
    ranks ask for no resources). STRICT_PACK when the plan puts every rank on one node: Ray then
    keeps them on one node or does not place them, never splits them."""
    import ray
    from ray.util.placement_group import placement_group

    bundle = _bundle(resources)
    if not bundle:
        return None
    one_node = len(planned) <= 1
    pg = placement_group([bundle] * world_size, strategy="STRICT_PACK" if one_node else "PACK")
    if not pg.wait(timeout_s):
        ray.util.remove_placement_group(pg)
        where = "on one node (where seal plan puts them)" if one_node else f"on {len(planned)} nodes"
        raise LayoutError(
            f"the cluster cannot place {world_size} learner ranks of {_ask(bundle)} each {where} within {timeout_s:g}s "
            "(learner.world_size, cluster.learner; `seal plan` shows the layout)"
        )
    return pg


def reserved_per_node(pg: Any) -> dict[str, dict[str, float]]:
    """Node id -> the resources the placement group holds there."""
    import ray

    if pg is None:
        return {}
    table = ray.util.placement_group_table(pg)
    out: dict[str, dict[str, float]] = {}
    for index, bundle in table["bundles"].items():
        node = out.setdefault(table["bundles_to_node_id"][index], {})
        for key, amount in bundle.items():
            node[key] = node.get(key, 0.0) + float(amount)
    return out


def free_nodes(
    ray_nodes: Sequence[Mapping[str, Any]], reserved: Mapping[str, Mapping[str, float]]
) -> list[dict[str, Any]]:
    """``ray.nodes()`` entries with the reservation taken out of their resources."""
    out = []
    for n in ray_nodes:
        held = reserved.get(n.get("NodeID", ""), {})
        res = {k: float(v) - held.get(k, 0.0) for k, v in (n.get("Resources") or {}).items()}
        out.append({**n, "Resources": res})
    return out


def spread_choice(
    handles: Mapping[str, Any],
    chosen: Mapping[str, str],
    ask: Mapping[str, float],
    reserved: Mapping[str, Mapping[str, float]],
) -> tuple[str | None, Any]:
    """The node for one more replica and its scheduling strategy (soft node affinity), or (None, None)
    to leave it to Ray: the node hosting the fewest of ``handles`` (placed, or ``chosen`` at their start)
    that holds one more beside them and beside ``reserved`` (the learner ranks' placement group)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    used: dict[str, int] = {}
    for name, seen in actor_nodes(handles, key="NodeID").items():
        where = seen if seen != "?" else chosen.get(name)
        if where is not None:
            used[where] = used.get(where, 0) + 1
    node = least_used_node(free_nodes(ray.nodes(), reserved), ask, used, prefer=ray.get_runtime_context().get_node_id())
    return (node, NodeAffinitySchedulingStrategy(node, soft=True)) if node is not None else (None, None)


def node_name(node: Mapping[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress', '?')} ({str(node.get('NodeID', '?'))[:8]})"


def check_replicas_fit(
    generator: ActorResources,
    replicas: int,
    ray_nodes: Sequence[Mapping[str, Any]],
    reserved: Mapping[str, Mapping[str, float]],
) -> None:
    """Every replica has a node beside the learner's reservation (first fit, as the plan places them)."""
    ask = _bundle(generator)
    if not ask:
        return
    free = free_nodes(ray_nodes, reserved)
    layout = place([Demand("generator", i, ask) for i in range(replicas)], nodes_from_ray(free), check_custom=True)
    if layout.unplaced:
        left = "; ".join(
            f"{node_name(n)}: " + ", ".join(f"{n['Resources'].get(k, 0.0):g} {k}" for k in ask)
            for n in free
            if n.get("Alive", True)
        )
        raise LayoutError(
            f"{len(layout.unplaced)} of {replicas} generator replicas of {_ask(ask)} each cannot be placed beside the "
            f"learner ranks' reservation (free: {left}); `seal plan` shows the layout"
        )


def _ranks(ranks: list[int]) -> str:
    return (
        f"{ranks[0]}-{ranks[-1]}"
        if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1))
        else ", ".join(map(str, ranks))
    )


def check_learner_nodes(
    planned: tuple[int, ...], rank_nodes: Sequence[str], names: Mapping[str, str] | None = None
) -> None:
    """The ranks (``rank_nodes``: node id per rank) are on no more nodes than the plan's layout."""
    if not planned:
        return
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(rank_nodes):
        by_node.setdefault(node, []).append(rank)
    if len(by_node) <= len(planned):
        return
    nodes = sorted(by_node.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    got = " + ".join(str(len(rs)) for _, rs in nodes)
    where = "; ".join(f"{(names or {}).get(n, n[:8])}: ranks {_ranks(rs)}" for n, rs in nodes)
    want = (
        f"one node ({planned[0]})" if len(planned) == 1 else f"{len(planned)} nodes ({' + '.join(map(str, planned))})"
    )
    raise LayoutError(
        f"learner ranks landed {got} over {len(by_node)} nodes ({where}) but seal plan puts them on {want}: "
        "ZeRO-3's gathers would cross nodes"
    )


# ----------------------------------------------------------------------------- the object store
def weights_bytes(s: Settings) -> tuple[float, str]:
    """Bytes of the weights the generator takes (the model in the generator's dtype: what one
    weight manifest puts in the object store) and a description, from config.json only."""
    config, source = model_config(s.model)
    spec = ModelSpec.from_config(config, Path(source).parent.name)
    dtype = generator_setup(s.generator).dtype
    return float(spec.params() * DTYPE_BYTES[dtype]), f"{spec.name} in {dtype}"


def object_store_need(weights: float) -> float:
    """Bytes of object store that hold ``weights`` bytes of weights and the margin."""
    return weights * OBJECT_STORE_MARGIN + OBJECT_STORE_SPARE_BYTES


def check_local_object_store(object_store_gb: float, weights: float, what: str) -> None:
    """A local Ray start's store (``cluster.object_store_gb``, GiB) holds the weights."""
    need = object_store_need(weights)
    if object_store_gb * 2**30 < need:
        raise ValueError(
            f"cluster.object_store_gb={object_store_gb:g} cannot hold the generator's weights "
            f"({weights / 1e9:.1f} GB: {what}), which a replica's restore and every object-store publish put "
            f"there whole: set cluster.object_store_gb={-(-need // 2**30):.0f} or more"
        )


def check_object_stores(
    ray_nodes: Sequence[Mapping[str, Any]], roles: Mapping[str, str], weights: float, what: str
) -> None:
    """Each node in ``roles`` (node id -> its actors) must have an object store that holds the weights."""
    need = object_store_need(weights)
    for n in ray_nodes:
        if n.get("NodeID") not in roles or not n.get("Alive", True):
            continue
        have = float((n.get("Resources") or {}).get("object_store_memory", 0.0))
        if have and have < need:
            raise LayoutError(
                f"node {node_name(n)} ({roles[n['NodeID']]}) has a {have / 1e9:.1f} GB object store; the "
                f"generator's weights ({weights / 1e9:.1f} GB: {what}) pass through it whole on a replica's "
                f"restore: start Ray there with `ray start --object-store-memory={int(-(-need // 1e9)) * 10**9}` or more"
            )
