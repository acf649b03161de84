"""The `cluster` config group, typed: what each actor reserves (``ActorResources``), the machines
`seal plan` assumes when no cluster runs (``Hardware``) and the group itself (``ClusterConfig``),
with the local checks a start makes. Below every wing of seal/: the estimator (seal/estimate)
plans with it, the runtime (seal/runtime/placement.py) starts Ray from it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
ACTORS = ("env_actor", "generator", "learner", "coordinator")  # the ClusterConfig fields that are ActorResources
RAY_AUTH_MODES = ("disabled", "token")  # the values of Ray's RAY_AUTH_MODE this config chooses between
_CPU_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_cpu_list(text: str) -> frozenset[int]:
    """A Linux CPU list ("1", "0-3,8") as a set; "" is the empty set."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _CPU_RANGE.fullmatch(part)
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ValueError(f"bad CPU list {text!r}: {part!r} is not a CPU number or an ascending range like 2-5")
        cpus.update(range(int(m[1]), int(m[2] if m[2] is not None else m[1]) + 1))
    return frozenset(cpus)


def pin_process(cpus: frozenset[int]) -> None:
    """Pin every thread of this process (and so every thread it starts later)
    to ``cpus``. Runs inside the actor, before its component is built, so the
    OpenMP pools of torch and vLLM start on those cores."""
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(f"CPUs {sorted(cpus - allowed)} are not available on this node (allowed: {sorted(allowed)})")
    done: set[str] = set()
    while True:  # again until no thread appears that an unpinned one started meanwhile
        todo = set(os.listdir("/proc/self/task")) - done
        if not todo:
            return
        for tid in todo:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        done |= todo


def _build_pinned(cpus: frozenset[int], factory: Callable[[], T]) -> T:
    pin_process(cpus)
    return factory()


@dataclass(frozen=True)
class ActorResources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    threads: int = 0  # torch/OMP threads in the actor (0: library default); pinned: one per core at most
    # Cores the actor's process is pinned to, a Linux CPU list ("1", "0-3,8"; "": not pinned). Disjoint
    # sets keep stages that run at once (async generation and learning) off each other's cores.
    cpus: str = ""
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources, e.g. {"node:env": 1}

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0 or self.threads < 0:
            raise ValueError(f"actor resources must be >= 0, got {self}")
        object.__setattr__(self, "cpus", str(self.cpus))  # `cpus=1` on the command line arrives as an int
        parse_cpu_list(self.cpus)

    def cpu_set(self) -> frozenset[int]:
        return parse_cpu_list(self.cpus)

    def thread_count(self) -> int:
        """Threads to run with (0: the library's default). Pinned: at most one
        per core (more OpenMP threads than cores only wait on each other)."""
        pinned = len(self.cpu_set())
        return min(self.threads or pinned, pinned) if pinned else self.threads

    def ray_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            opts["resources"] = dict(self.resources)
        return opts

    def bundle(self) -> dict[str, float]:
        """What one such actor asks of a node, in ray.nodes()' and placement groups' resource names."""
        return {
            "CPU": float(self.num_cpus),
            "GPU": float(self.num_gpus),
            **{k: float(v) for k, v in self.resources.items()},
        }

    def env_vars(self) -> dict[str, str]:
        threads = self.thread_count()
        return {"OMP_NUM_THREADS": str(threads)} if threads else {}

    def pinned(self, factory: Callable[[], T]) -> Callable[[], T]:
        """``factory`` that first pins the calling process to ``cpus`` (the
        actor calls it in its constructor); ``factory`` itself when unpinned."""
        cpus = self.cpu_set()
        return functools.partial(_build_pinned, cpus, factory) if cpus else factory


@dataclass(frozen=True)
class Hardware:
    """The machines a configuration is planned for when no cluster is running (`seal plan`):
    ``nodes`` alike, each with ``gpus_per_node`` GPUs of ``gpu_gb`` GB, ``cpus_per_node``
    logical CPUs and ``memory_gb`` of host memory. What a running cluster reports wins."""

    nodes: int = 1
    gpus_per_node: int = 0
    gpu_gb: float = 0.0
    cpus_per_node: int = 1
    memory_gb: float = 0.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 0 or self.gpu_gb < 0 or self.cpus_per_node < 1 or self.memory_gb < 0:
            raise ValueError(f"cluster.hardware needs nodes >= 1, cpus_per_node >= 1 and no negative sizes, got {self}")


@dataclass(frozen=True)
class ClusterConfig:
    address: str | None = None  # None: start Ray here; "auto" or host:port: join a cluster
    bind_host: str = "127.0.0.1"  # where the driver's sockets (replay stream, control) listen; 0.0.0.0 across nodes
    env_actors: int = 2  # independent of generators and learner; `seal scale RUN_DIR env=N` changes it live
    spread_env_actors: bool = True  # SPREAD scheduling: env actors on different nodes where there are several
    max_restarts: int = 3  # per env/generator actor; its in-flight groups are re-issued
    object_store_gb: float = 4.0  # local start only (weights pass through it)
    actor_logs: bool = (
        False  # stream actors' stdout/stderr (vLLM, DeepSpeed) to this terminal; else only in Ray's log dir
    )
    ray_auth: str = (
        "disabled"  # Ray's RAY_AUTH_MODE for this driver: "token" (multinode) or "disabled" (see ray_auth_env)
    )
    env_actor: ActorResources = field(default_factory=lambda: ActorResources(num_cpus=0.5, threads=1))
    generator: ActorResources = field(default_factory=ActorResources)
    learner: ActorResources = field(default_factory=ActorResources)
    coordinator: ActorResources = field(default_factory=lambda: ActorResources(num_cpus=0.0, threads=1))
    # What `seal plan` (and `seal train`'s check) plans for when no cluster is running; None: this machine.
    hardware: Hardware | None = None

    def __post_init__(self) -> None:
        if self.env_actors < 1:
            raise ValueError(f"cluster.env_actors must be >= 1, got {self.env_actors}")
        if self.max_restarts < 0:
            raise ValueError(f"cluster.max_restarts must be >= 0, got {self.max_restarts}")
        if self.ray_auth not in RAY_AUTH_MODES:
            raise ValueError(f"cluster.ray_auth must be one of {', '.join(RAY_AUTH_MODES)}, got {self.ray_auth!r}")
        for name in ACTORS:
            value = getattr(self, name)
            if isinstance(value, dict):  # hydra passes nested plain dicts
                object.__setattr__(self, name, ActorResources(**value))
        if isinstance(self.hardware, dict):
            object.__setattr__(self, "hardware", Hardware(**self.hardware))

    def check_local_cpus(self) -> None:
        """Pinned cores must exist here (a local start: every actor runs on this machine)."""
        allowed = os.sched_getaffinity(0)
        for name in ACTORS:
            missing = getattr(self, name).cpu_set() - allowed
            if missing:
                raise ValueError(
                    f"cluster.{name}.cpus={getattr(self, name).cpus!r} names CPUs {sorted(missing)} "
                    f"this machine does not offer (it has {sorted(allowed)})"
                )

    def check_local_resources(
        self, gpus: Callable[[], int | None] | None = None, learner_ranks: int = 1, replicas: int = 1
    ) -> None:
        """A local Ray has this machine's GPUs and no custom resources: an actor
        asking for more would wait for them forever instead of failing. Every actor
        counts: ``learner_ranks`` (learner.world_size) and generator ``replicas``."""
        for name in ACTORS:
            custom = [k for k in getattr(self, name).resources if not k.startswith(("node:", "accelerator_type:"))]
            if custom:
                raise ValueError(
                    f"cluster.{name}.resources asks for {', '.join(custom)}, which a local Ray start does not have "
                    "(custom resources come from `ray start --resources` on a cluster: set cluster.address)"
                )
        counts = {
            "env_actor": (self.env_actors, "env actors"),
            "learner": (learner_ranks, "learner ranks"),
            "generator": (replicas, "generator replicas"),
        }
        asks = {name: getattr(self, name).num_gpus * counts.get(name, (1, ""))[0] for name in ACTORS}
        need = round(sum(asks.values()), 6)
        if need <= 0:
            return
        have = (gpus or local_gpu_count)()
        if have is not None and need > have:

            def times(n: str) -> str:
                k, what = counts.get(n, (1, ""))
                return f" x {k} {what}" if k != 1 else ""

            parts = ", ".join(
                f"cluster.{n}.num_gpus={getattr(self, n).num_gpus:g}{times(n)}" for n, v in asks.items() if v
            )
            raise ValueError(f"the actors ask for {need:g} GPUs ({parts}) but a local Ray start here has {have}")

    def local_cpus(self, learner_ranks: int = 1, replicas: int = 1) -> int:
        """Logical CPUs for a local Ray: all configured actors must fit, even on 2 cores (every
        learner rank and replica: an actor that does not fit waits for its CPUs for ever)."""
        need = (
            self.env_actors * self.env_actor.num_cpus
            + replicas * self.generator.num_cpus
            + learner_ranks * self.learner.num_cpus
            + self.coordinator.num_cpus
        )
        return max(os.cpu_count() or 1, int(need + 0.999) + 2)  # room to scale env actors up


def local_gpu_count() -> int | None:
    """GPUs a local Ray start would register, by Ray's own detection (CUDA_VISIBLE_DEVICES
    included); None when this Ray version does not expose it (then nothing is refused)."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        if manager is None:
            return 0
        count = int(manager.get_current_node_num_accelerators())
        visible = manager.get_current_process_visible_accelerator_ids()
    except (ImportError, AttributeError):
        return None
    return min(count, len(visible)) if visible is not None else count
