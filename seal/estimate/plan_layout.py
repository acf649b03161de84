"""Where a configuration's actors would land (`seal plan`): first-fit placement of their
resource asks over nodes, the nodes either declared (``cluster.hardware``), this machine, or
a running cluster's own (``ray.nodes()``). Pure functions but ``query_cluster``."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal.cluster_config import Hardware


@dataclass(frozen=True)
class Demand:
    """One actor's ask: Ray resources (CPU, GPU, custom) on one node, and the host memory it uses there."""

    role: str  # generator | learner | coordinator | env
    index: int
    resources: Mapping[str, float]
    host_gb: float = 0.0


@dataclass
class Node:
    name: str
    capacity: dict[str, float]  # CPU, GPU, memory (GB of host memory), custom resources
    gpu_gb: float | None = None
    free: dict[str, float] = field(default_factory=dict)
    placed: list[Demand] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.free:
            self.free = dict(self.capacity)

    def takes(self, d: Demand, check_custom: bool) -> bool:
        for key, amount in d.resources.items():
            if not amount:
                continue
            if key not in self.capacity and not check_custom and key not in ("CPU", "GPU"):
                continue  # declared hardware knows no custom resources: not checked
            if self.free.get(key, 0.0) + 1e-9 < amount:
                return False
        return True

    def place(self, d: Demand) -> None:
        for key, amount in d.resources.items():
            if key in self.free:
                self.free[key] -= amount
        if "memory" in self.free:
            self.free["memory"] -= d.host_gb  # checked per node by layout_problems, not at placement
        self.placed.append(d)


@dataclass
class Layout:
    nodes: list[Node]
    unplaced: list[Demand]
    checked_custom: bool  # the nodes are a real cluster's (custom resources checked too)


def hardware_nodes(hw: Hardware) -> list[Node]:
    return [
        Node(
            f"node {i}",
            {"CPU": float(hw.cpus_per_node), "GPU": float(hw.gpus_per_node), "memory": float(hw.memory_gb)},
            hw.gpu_gb or None,
        )
        for i in range(hw.nodes)
    ]


def nodes_from_ray(ray_nodes: Sequence[Mapping[str, Any]], gpu_gb: float | None = None) -> list[Node]:
    """Alive nodes of ``ray.nodes()``: their resources (memory in GB), GPU size from ``gpu_gb`` (Ray does not report it)."""
    out: list[Node] = []
    for n in ray_nodes:
        if not n.get("Alive", True):
            continue
        res = dict(n.get("Resources", {}))
        cap = {k: float(v) for k, v in res.items() if not k.startswith("node:") and k != "object_store_memory"}
        cap["memory"] = float(res.get("memory", 0.0)) / 1e9
        cap.setdefault("CPU", 0.0)
        cap.setdefault("GPU", 0.0)
        out.append(Node(str(n.get("NodeManagerAddress", f"node {len(out)}")), cap, gpu_gb))
    return out


def place(demands: Sequence[Demand], nodes: list[Node], spread_env: bool = True, check_custom: bool = False) -> Layout:
    """First fit, largest GPU asks first (a generator replica needs all its GPUs on one node), then
    the learner ranks packed onto as few nodes as hold them (their placement group is PACK), the
    coordinator, and env actors spread round-robin (SPREAD) or packed."""
    order = {"driver": -1, "generator": 0, "learner": 1, "coordinator": 2, "env": 3}
    todo = sorted(demands, key=lambda d: (order.get(d.role, 4), -d.resources.get("GPU", 0.0), d.index))
    unplaced: list[Demand] = []
    turn = 0
    for d in todo:
        candidates = nodes
        if d.role == "driver":  # the driver (replay server) runs on the head node, outside Ray's accounting
            candidates = nodes[:1]
        elif d.role == "env" and spread_env and nodes:
            candidates = nodes[turn % len(nodes) :] + nodes[: turn % len(nodes)]
            turn += 1
        elif d.role == "learner":  # PACK: the node already holding ranks first, then the one with most GPUs free
            candidates = sorted(
                nodes, key=lambda n: (-sum(p.role == "learner" for p in n.placed), -n.free.get("GPU", 0.0))
            )
        node = next((n for n in candidates if n.takes(d, check_custom)), None)
        if node is None:
            unplaced.append(d)
        else:
            node.place(d)
    return Layout(nodes, unplaced, check_custom)


def layout_problems(layout: Layout) -> list[str]:
    """One line per kind of actor that cannot be placed, and per node whose host memory is oversubscribed."""
    problems = []
    by_role: dict[str, list[Demand]] = {}
    for d in layout.unplaced:
        by_role.setdefault(d.role, []).append(d)
    for role, ds in by_role.items():
        ask = ", ".join(f"{v:g} {k}" for k, v in ds[0].resources.items() if v)
        free = (
            "; ".join(
                f"{n.name}: " + ", ".join(f"{n.free.get(k, 0.0):g} {k}" for k in ds[0].resources if ds[0].resources[k])
                for n in layout.nodes
            )
            or "no nodes"
        )
        total = len(ds) + sum(d.role == role for n in layout.nodes for d in n.placed)
        what = (
            f"{len(ds)} of {total} {role} actors" if total > len(ds) else f"{len(ds)} {role} actor{'s' * (len(ds) > 1)}"
        )
        problems.append(f"{what} of {ask} each cannot be placed (free: {free})")
    for n in layout.nodes:
        used = sum(d.host_gb for d in n.placed)
        have = n.capacity.get("memory", 0.0)
        if have and used > have:
            problems.append(f"{n.name}: its actors need {used:.1f} GB of host memory, it has {have:.1f} GB")
    return problems


def describe_node(n: Node) -> str:
    counts: dict[str, list[Demand]] = {}
    for d in n.placed:
        counts.setdefault(d.role, []).append(d)
    parts = []
    for role in ("driver", "generator", "learner", "coordinator", "env"):
        ds = counts.get(role, [])
        if ds:
            ask = ", ".join(f"{v:g} {k}" for k, v in ds[0].resources.items() if v)
            parts.append(f"{role} x{len(ds)}" + (f" ({ask} each)" if ask else ""))
    used_gpu = n.capacity.get("GPU", 0.0) - n.free.get("GPU", 0.0)
    gpus = f"{used_gpu:g}/{n.capacity.get('GPU', 0.0):g} GPUs"
    cpus = f"{n.capacity.get('CPU', 0.0) - n.free.get('CPU', 0.0):g}/{n.capacity.get('CPU', 0.0):g} CPUs"
    host = sum(d.host_gb for d in n.placed)
    mem = f", {host:.1f}/{n.capacity['memory']:.0f} GB host" if n.capacity.get("memory") else ""
    return f"{n.name}: {gpus}, {cpus}{mem}: " + ("; ".join(parts) or "nothing")


def local_machine(gpus: int | None, logical_cpus: int | None = None) -> Hardware:
    """This machine as one node (a local Ray start, with ``logical_cpus`` if given: ClusterConfig.local_cpus)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    return Hardware(
        1,
        int(gpus or 0),
        local_gpu_gb() if gpus else 0.0,
        logical_cpus or len(os.sched_getaffinity(0)),
        round(memory, 1),
    )


def local_gpu_gb() -> float:
    """One local GPU's memory in GB by nvidia-smi (0.0 when it cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        return round(min(float(x) for x in out) * 2**20 / 1e9, 1) if out else 0.0
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0.0


def query_cluster(address: str, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """``ray.nodes()`` of the cluster at ``address`` (joined as a driver, then left), or RuntimeError
    when it does not answer within ``timeout_s``."""
    result: dict[str, Any] = {}

    def join() -> None:
        try:
            import ray

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=address, log_to_driver=False, logging_level="error")  # type: ignore[arg-type]  # a name works too
            result["nodes"] = ray.nodes()
            ray.shutdown()
        except Exception as exc:  # reported as one line
            result["error"] = exc

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "nodes" in result:
        return result["nodes"]
    why = str(result["error"]).split(". ")[0] if "error" in result else f"no answer within {timeout_s:g}s"
    raise RuntimeError(f"cluster.address={address}: {why}")
