"""Creating, placing, scaling and stopping the pipeline's Ray actors.

Each actor gets a factory of its component built from the resolved config
(the component never sees hydra or this package) and the resources of the
`cluster` group. Env actors and the generator restart after a crash (Ray's
max_restarts); a restarted generator holds its requests until the driver has
given it the latest weights. Scaling down retires env actors: they take no
new group, and stop once their current group is sent, so no task is lost or
played twice.
"""

from __future__ import annotations

import functools
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from omegaconf import OmegaConf

from actors.coordinator.coordinator import Coordinator, CoordinatorState
from actors.coordinator.service import CoordinatorService
from actors.env_actor import EnvActor
from actors.generation.adapters import adapter_serving_spec, adapter_slots
from actors.generation.engine_settings import EngineSettings
from learner.lora import publishes_adapter
from replay.auth import ClientKeys
from seal.chat_setup import chat_options
from seal.cluster_config import ClusterConfig
from seal.config import Settings, instantiate, instantiate_spec
from seal.estimate.plan import run_io_bounds
from seal.runtime.generator_fleet import GeneratorFleet
from seal.runtime.generator_spec import is_async_engine
from seal.runtime.handles import CoordinatorHandle, EnvActorHandle, ReplicaHandle, kill
from seal.runtime.layout_guard import (
    check_learner_nodes,
    check_object_stores,
    check_replicas_fit,
    node_name,
    planned_learner_nodes,
    reserve_learner,
    reserved_per_node,
    weights_bytes,
)
from seal.runtime.learner_group import LearnerGroup
from seal.runtime.placement import actor_nodes
from seal.runtime.storage import check_nodes_see
from weights.model_assets import load_tokenizer

if TYPE_CHECKING:
    from seal.runtime.generator_fleet import GeneratorFleet
    from seal.runtime.learner_group import LearnerGroup

log = logging.getLogger(__name__)


def make_coordinator(
    interface: dict, tag_weights: dict, closed_loop: bool, per_category: bool, vocabulary: str, guideline_policy: dict
) -> Coordinator:
    return Coordinator(
        instantiate_spec(interface),
        instantiate_spec(tag_weights),
        closed_loop=closed_loop,
        per_category_guidelines=per_category,
        vocabulary=vocabulary,
        guideline_policy=instantiate_spec(guideline_policy),
    )


def _spec(node) -> dict[str, Any]:
    spec = OmegaConf.to_container(node, resolve=True)
    assert isinstance(spec, dict), node  # a config group: a mapping
    return {str(k): v for k, v in spec.items()}


class ActorSet:
    # Set as each starts (the fleet and the learner group in __init__, the coordinator in
    # start_coordinator); absent until then, which close() allows for.
    generators: GeneratorFleet
    learners: LearnerGroup
    coordinator: CoordinatorHandle

    def __init__(
        self,
        cfg,
        settings: Settings,
        cluster: ClusterConfig,
        replay_address: str,
        storage: str | None = None,
        replay_keys: ClientKeys | None = None,
    ) -> None:
        """``settings``: ``cfg``'s typed groups (seal/config.py); ``replay_keys``: the env actors' CURVE
        keys for the replay stream (None: a plain stream)."""
        import ray

        self.cfg, self.settings, self.cluster = cfg, settings, cluster
        self.replay_address, self.replay_keys = replay_address, replay_keys
        self.prefix = f"seal-{uuid.uuid4().hex[:8]}"  # actor names unique to this pipeline
        self.sampling = instantiate(cfg.sampling)
        transport = instantiate(cfg.transport)
        self.hwm, self.send_timeout_s = transport.hwm, transport.send_timeout_s
        self.env: dict[str, EnvActorHandle] = {}  # name -> handle, serving
        self.retiring: dict[str, EnvActorHandle] = {}
        self.closing: dict[str, Any] = {}  # retired env actor -> its close() call (an ObjectRef), in flight
        self.recovering: dict[str, Any] = {}  # name -> probe ref: crashed, serving again once the probe answers
        self.target_env = 0
        self._created = 0
        spec, gen_spec = _spec(cfg.learner), _spec(cfg.generator)

        group, fleet = settings.learner, settings.generator
        # A LoRA learner publishing adapters: the replicas serve them (actors/generation/adapters.py).
        adapter_rank = group.cfg.lora.rank if group.cfg.lora is not None and publishes_adapter(group.cfg) else None
        gen_spec = adapter_serving_spec(gen_spec, adapter_rank, fleet.max_lora_rank, is_async_engine(fleet.target))
        if settings.trainer.reference_logprobs == "generator":  # refused without adapters (seal/run/pipeline.py)
            gen_spec["max_loras"] = adapter_slots(fleet.max_loras, EngineSettings.max_loras, True)
        io = run_io_bounds(cfg, settings)  # checkpoint, resume and snapshot bounded by their bytes
        replicas = fleet.replicas
        # The learner ranks' layout as `seal plan` states it, reserved before any replica starts:
        # replicas started first could leave no node that holds every rank (seal/runtime/layout_guard.py).
        nodes = ray.nodes()
        self.planned_rank_nodes = planned_learner_nodes(
            cluster.generator, cluster.learner, replicas, group.world_size, nodes
        )
        pg = reserve_learner(cluster.learner, group.world_size, self.planned_rank_nodes, group.timeout_s)
        try:
            reserved = reserved_per_node(pg)
            check_replicas_fit(cluster.generator, replicas, nodes, reserved)
            # generator.replicas engines behind the router (seal/runtime/generator_fleet.py); started
            # before the learner ranks so both load at once.
            self.generators = GeneratorFleet(
                gen_spec,
                cluster.generator,
                self.prefix,
                cluster.max_restarts,
                fleet.fleet_update_timeout_s,  # a blocking engine's: GeneratorConfig's own bound
                wait=False,
                reserved=reserved,
            )
            # The learner group: world_size ranks in the reserved bundles, each with cluster.learner's resources; `learner` is rank 0.
            self.learners = LearnerGroup(
                functools.partial(instantiate_spec, spec),
                group,
                cluster.learner,
                io=io,
                env_vars=cluster.learner.env_vars(),
                placement=pg,
            )
            self.learner = self.learners.actors[0]
            self.generators.wait_ready(self.generators.names)
            self.check_layout(nodes)
        except BaseException:
            if not hasattr(self, "learners") and pg is not None:
                ray.util.remove_placement_group(pg)  # the group owns it once made
            self.close()
            raise
        if storage is not None:
            self.check_storage(storage)

    def node_roles(self) -> dict[str, str]:
        """Ray node id -> the learner ranks and generator replicas on it."""
        roles = self.learners.node_roles()
        for name, node in actor_nodes(self.generators.handles, key="NodeID").items():
            if node != "?":
                roles[node] = f"{roles[node]}, {name}" if node in roles else name
        return roles

    def check_storage(self, storage: str) -> None:
        """Every node with a learner rank or a generator replica must see the run's storage (seal/runtime/storage.py)."""
        check_nodes_see(Path(storage), self.node_roles(), timeout_s=self.settings.learner.timeout_s)

    def check_layout(self, nodes: list) -> None:
        """The ranks landed where the plan puts them, and every node with a rank or a replica has an
        object store that holds the generator's weights (a replica's restore puts them there whole)."""
        check_learner_nodes(
            self.planned_rank_nodes,
            [n.get("node_id", "?") for n in self.learners.nodes],
            {n["NodeID"]: node_name(n) for n in nodes},
        )
        weights, what = weights_bytes(self.settings)
        check_object_stores(nodes, self.node_roles(), weights, what)

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each actor runs now: {"learner": {"rank-0": ip}, "generator": {...}, "env": {...}, "coordinator": ...}."""
        return {
            "learner": {f"rank-{r}": node["ip"] for r, node in enumerate(self.learners.nodes)},
            "generator": actor_nodes(self.generators.handles),
            "env": actor_nodes(self.env),
            "coordinator": actor_nodes({"coordinator": self.coordinator}) if hasattr(self, "coordinator") else {},
        }

    @property
    def generator(self) -> ReplicaHandle:
        """The first replica (what a single-generator caller, e.g. a benchmark, talks to)."""
        return self.generators.first

    @staticmethod
    def _wait_ready(refs: list, what: str) -> None:
        import ray

        try:
            ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            cause = getattr(exc, "error_msg", None) or str(exc)
            raise RuntimeError(f"the {what} failed to start: {cause.strip().splitlines()[-1]}") from None

    def start_coordinator(self, state: CoordinatorState | None, closed_loop: bool, per_category: bool) -> None:
        """``closed_loop``, ``per_category``: trainer.closed_loop and trainer.per_category_guidelines."""
        import ray

        factory = functools.partial(
            make_coordinator,
            _spec(self.cfg.interface),
            _spec(self.cfg.tag_weights),
            closed_loop,
            per_category,
            self.settings.learner.cfg.apatch.vocabulary,
            _spec(self.cfg.guideline_policy),
        )
        options = dict(
            name=f"{self.prefix}-coordinator",
            max_restarts=0,
            runtime_env={"env_vars": self.cluster.coordinator.env_vars()},
            **self.cluster.coordinator.ray_options(),
        )
        if not self.cluster.coordinator.resources:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # On the driver's node: the coordinator is the run's state (capability, interface, tag
            # weights) and has no restart; on another node, losing that node would end the run.
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            )
        self.coordinator = cast(
            CoordinatorHandle,
            ray.remote(CoordinatorService).options(**options).remote(self.cluster.coordinator.pinned(factory), state),
        )
        self._wait_ready([self.coordinator.interface.remote()], "coordinator")

    # ---------------------------------------------------------- env actors
    def scale_env(self, n: int) -> None:
        """Serve with n env actors: start new ones, or retire the newest."""
        import ray

        if n < 1:
            raise ValueError(f"env actors must be >= 1, got {n}")
        self.target_env = n
        res = self.cluster.env_actor
        options: dict[str, Any] = dict(
            max_concurrency=2,
            max_restarts=self.cluster.max_restarts,
            max_task_retries=0,
            runtime_env={"env_vars": {**res.env_vars(), "TOKENIZERS_PARALLELISM": "false"}},
            **res.ray_options(),
        )
        if self.cluster.spread_env_actors:
            options["scheduling_strategy"] = "SPREAD"
        started = []
        while len(self.env) < n:
            name = f"env-{self._created}"
            self._created += 1
            handle = cast(
                EnvActorHandle,
                ray.remote(EnvActor)
                .options(**options)
                .remote(
                    # The actor's constructor calls the tokenizer factory before any env work: it pins the process.
                    name,
                    functools.partial(instantiate_spec, _spec(self.cfg.env)),
                    res.pinned(functools.partial(load_tokenizer, str(self.cfg.model.path))),
                    self.generators.names[0],
                    f"{self.prefix}-coordinator",
                    self.replay_address,
                    self.sampling,
                    self.hwm,
                    self.send_timeout_s,
                    # The keys travel as a constructor argument: in memory, through Ray (whose token
                    # auth guards the cluster, docs/main-job.md), never in a file; Ray keeps them to restart the actor.
                    self.replay_keys,
                    not self.generators.is_async,
                    chat_options(self.cfg),
                ),
            )
            self.env[name] = handle
            self.coordinator.register_env_actor.remote(name, handle)
            started.append(handle)
        while len(self.env) > n:
            name = sorted(self.env, key=lambda k: int(k.split("-")[1]))[-1]
            self.retiring[name] = self.env.pop(name)
        if started:
            self._wait_ready([h.pid.remote() for h in started], "env actors")

    def idle_env_actor(self, busy: set[str]) -> tuple[str, EnvActorHandle] | None:
        self.reap(busy)
        self._check_recovering()
        for name, handle in self.env.items():
            if name not in busy and name not in self.recovering:
                return name, handle
        return None

    def crashed(self, name: str) -> None:
        """An env actor's group failed with the actor gone: Ray restarts it;
        no group goes to it until it answers."""
        if name in self.env:
            self.recovering[name] = self.env[name].pid.remote()

    def _check_recovering(self) -> None:
        import ray

        for name, probe in list(self.recovering.items()):
            ready, _ = ray.wait([probe], timeout=0)
            if not ready:
                continue
            try:
                ray.get(probe)
                del self.recovering[name]
                log.warning("env actor %s is back", name)
            except ray.exceptions.ActorDiedError:  # out of restarts: replace it
                del self.recovering[name]
                self.coordinator.unregister_env_actor.remote(name)
                del self.env[name]
                log.warning("env actor %s is gone for good; starting a replacement", name)
                self.scale_env(self.target_env)
            except ray.exceptions.RayActorError:  # still restarting
                self.recovering[name] = self.env[name].pid.remote()

    def reap(self, busy: set[str]) -> None:
        """Stop retired env actors that have finished their last group: first
        their sender delivers what it still holds (``EnvActor.close``, waited
        for without blocking the loop), then the actor is killed."""
        import ray

        for name in [k for k in self.retiring if k not in busy and k not in self.closing]:
            self.closing[name] = self.retiring[name].close.remote()
        for name, ref in list(self.closing.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:  # it died meanwhile: its groups are re-issued as lost
                log.warning("env actor %s failed to close its sender: %s", name, exc)
            del self.closing[name]
            handle = self.retiring.pop(name)
            self.coordinator.unregister_env_actor.remote(name)
            kill(handle, no_restart=True)
            log.info("env actor %s retired", name)

    def close(self) -> None:
        if hasattr(self, "learners"):
            self.learners.close()
        if hasattr(self, "generators"):
            self.generators.close()
        coordinator = [self.coordinator] if hasattr(self, "coordinator") else []
        for handle in [*self.env.values(), *self.retiring.values(), *coordinator]:
            try:
                kill(handle, no_restart=True)
            except Exception:  # already gone
                pass
