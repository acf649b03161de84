"""The nodes a rehearsal runs on (`seal rehearse`): a local Ray cluster of logical nodes shaped like
the recipe's ``cluster.hardware``, or the user's own cluster (``cluster.address``).

Local: one raylet per node of the recipe (ray.cluster_utils.Cluster), each declaring the recipe's
GPUs per node as logical Ray GPUs and its CPUs as logical CPUs. Ray's scheduler sees exactly the
cluster a GPU run would (node ids, resources per node): placement groups, bundles and node
affinities resolve as they would there. What it does not have is a network between the nodes
(every raylet has this machine's address); tests/integration/test_two_hosts.py covers that part
(separate addresses, token auth, a node-local disk) with network namespaces.

Memory is sampled while the rehearsal runs: the resident set of this process and every process
under it (the raylets and their workers: learner ranks, vLLM engines and their TP workers).
"""

from __future__ import annotations

import _thread
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

# A raylet starts one idle Python worker per logical CPU when the first driver connects: 96 of them
# per node for a recipe's node. Actors start their own workers; idle ones would only eat memory.
RAYLET_ENV = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
OBJECT_STORE_BYTES = 512 * 2**20  # per node: the tiny model's weights are ~30 MB


@dataclass(frozen=True)
class NodeSpec:
    """One logical node: what it declares to Ray."""

    cpus: int
    gpus: int


@dataclass
class LocalCluster:
    """A Ray cluster of ``nodes`` raylets on this machine; ``address`` is what drivers join."""

    nodes: list[NodeSpec]
    cluster: Any = None
    address: str = ""
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def start(self) -> LocalCluster:
        from ray.cluster_utils import Cluster

        for key, value in {**RAYLET_ENV, "RAY_AUTH_MODE": "disabled"}.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ.setdefault(key, value)
        head, *rest = self.nodes
        self.cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={
                "num_cpus": head.cpus,
                "num_gpus": head.gpus,
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE_BYTES,
            },
        )
        for node in rest:
            self.cluster.add_node(num_cpus=node.cpus, num_gpus=node.gpus, object_store_memory=OBJECT_STORE_BYTES)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        return self

    def logs_dir(self) -> str:
        """Ray's log folder of this cluster's session (actors' stderr: a dead rank's stack is there)."""
        return str(self.cluster.head_node.get_logs_dir_path()) if self.cluster is not None else ""

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()  # its own raylets and GCS only, never another Ray on this machine
            self.cluster = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def node_specs(hardware) -> list[NodeSpec]:
    """The recipe's nodes (``cluster.hardware``): its GPUs and CPUs per node, as logical resources."""
    return [NodeSpec(int(hardware.cpus_per_node), int(hardware.gpus_per_node)) for _ in range(int(hardware.nodes))]


def alive_nodes() -> list[dict[str, Any]]:
    """The joined cluster's alive nodes, head first: {"node_id", "ip", "GPU", "CPU"}."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    head = ray.get_runtime_context().get_node_id()
    nodes.sort(key=lambda n: (n["NodeID"] != head, n["NodeID"]))
    return [
        {
            "node_id": n["NodeID"],
            "ip": n.get("NodeManagerAddress", "?"),
            "GPU": n.get("Resources", {}).get("GPU", 0.0),
            "CPU": n.get("Resources", {}).get("CPU", 0.0),
        }
        for n in nodes
    ]


class MemorySampler:
    """Peak of the summed resident set of this process and all its descendants, every ``every_s``."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rehearse-memory", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def sample(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> float:
        """Stops sampling; the peak in GB (2**30)."""
        self._stop.set()
        self._thread.join(timeout=10)
        return self.peak_bytes / 2**30


class Watchdog:
    """Ends a rehearsal that stops making progress: after ``timeout_s`` it names what is stuck (actors
    Ray cannot place, or the phase it was in) and interrupts the main thread, whose blocking Ray
    waits raise KeyboardInterrupt; the rehearsal reports ``reason`` as its failure."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.phase = "starting"
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rehearse-watchdog", daemon=True)
        self._started = time.monotonic()

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def _loop(self) -> None:
        if self._stop.wait(self.timeout_s):
            return
        pending = pending_actors()
        stuck = f"; Ray has not placed {', '.join(pending)}" if pending else ""
        self.reason = f"no result within {self.timeout_s:.0f} s (--timeout) while {self.phase}{stuck}"

        _thread.interrupt_main()

    def stop(self) -> None:
        self._stop.set()


def pending_actors() -> list[str]:
    """Actors of the joined cluster still waiting to be created, with what they ask for."""
    try:
        from ray._private import state

        actors = state.actors()
    except Exception:  # a private API; the reason is still given without it
        return []
    out = []
    for info in actors.values():
        if info.get("State") in ("PENDING_CREATION", "DEPENDENCIES_UNREADY"):
            name = info.get("Name") or info.get("ActorClassName") or info.get("ActorID", "?")[:8]
            res = info.get("RequiredResources") or {}
            out.append(f"{name}" + (f" (asks {', '.join(f'{v:g} {k}' for k, v in res.items())})" if res else ""))
    return out
