"""The run's generator replicas, as the driver sees them.

``generator.replicas=M`` Ray actors, each one engine (with its own
tensor-parallel workers: ``generator.tensor_parallel_size`` on GPU), spread
over the nodes. The blocking engine (actors/generation/vllm_engine.py) is served by a
``GeneratorServer``; the async engine (actors/generation/async_vllm_engine.py) is its
own Ray async actor. Both answer the same calls.

The fleet owns:
- routing (seal/runtime/router.py): each group's replica is fixed at dispatch;
- weight updates: every serving replica gets each version (object store or
  the learner's broadcast group, which spans 1 + M x TP ranks); a replica
  that does not confirm within ``update_timeout_s`` is named in the log,
  taken out of the router and restarted (Ray restarts it), then re-synced;
- restore: a restarted replica, or one whose load failed part way, holds its
  requests until it has the latest weights (probed every 2 s), and only then
  rejoins the router; one whose engine core died in its live actor
  (``ReplicaEngineDead``, from the probe or the restore) is restarted instead;
- scaling: ``scale(M)`` starts replicas (current weights before they serve)
  or retires the newest (out of the router first; stopped once its groups end).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from actors.generation.replica_counters import ReplicaStats
from actors.generation.server import GeneratorServer, ReplicaEngineDead
from replay.token_ledger import GeneratorCount
from seal.config import instantiate_spec
from seal.runtime.fleet_counters import FleetCounters, canary_gap
from seal.runtime.generator_spec import is_async_engine, split_generator_spec
from seal.runtime.handles import ReplicaHandle, kill
from seal.runtime.layout_guard import spread_choice
from seal.runtime.replica_deaths import ReplicaDeaths
from seal.runtime.router import ReplicaRouter

log = logging.getLogger(__name__)


class GeneratorFleet:
    def __init__(
        self,
        spec: dict,
        resources,
        prefix: str,
        max_restarts: int,
        update_timeout_s: float,
        wait: bool = True,
        reserved: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        """``wait``: return once every replica has started (else call ``wait_ready``). ``reserved``:
        node id -> resources held there for others (the learner ranks' placement group), which a
        replica's node choice must leave alone."""
        self.spec, count = split_generator_spec(spec)
        self.reserved = dict(reserved or {})
        self.resources, self.prefix, self.max_restarts = resources, prefix, max_restarts
        self.tp = int(self.spec["tensor_parallel_size"])  # GeneratorConfig's: every option sets it
        self.is_async = is_async_engine(self.spec["_target_"])
        self.update_timeout_s = float(update_timeout_s)
        self.handles: dict[str, ReplicaHandle] = {}
        self.versions: dict[str, int] = {}
        self.retiring: dict[str, ReplicaHandle] = {}
        self.pending: dict[Any, tuple[str, int, float]] = {}  # update ref -> (replica, version, started)
        self.probes: dict[str, tuple[Any, float]] = {}  # replica -> (awaiting_weights ref, sent)
        self.restoring: set[str] = set()  # out of the router until they have the latest weights
        self._probed: dict[str, float] = {}
        self.deaths = ReplicaDeaths(max_restarts)  # a replica Ray gave up on ends the run, not a wait
        self.restores: dict[str, tuple[Any, int, float]] = {}  # replica -> (update ref, version, started)
        self.published_version = 0
        self.counters = FleetCounters()
        self.token_count = GeneratorCount()  # the generator's own count, across restarts (the token books)
        self._count_read_all = False  # the latest stats() reached every replica
        self._count_short = False  # a retired replica's final count could not be read
        # The weight-sync canary: after each confirmed update the replica scores canary_ids and
        # its logprobs must be within canary_max_diff of the learner's (``expect``) at that version.
        self.canary_ids: list[int] = []
        self.canary_max_diff = 1.0
        self._expected: tuple[int, list[float]] | None = None
        # prompt_logprobs ref -> (replica, version, expected)
        self.canaries: dict[Any, tuple[str, int, list[float]]] = {}
        self._made = 0
        self.chosen_nodes: dict[str, str] = {}  # replica -> the node asked for at its start
        names = [self._start(await_weights=False) for _ in range(count)]
        self.router = ReplicaRouter(names)
        if wait:
            self.wait_ready(names)

    # ------------------------------------------------------------ actors
    def _start(self, await_weights: bool) -> str:
        import ray

        name = f"{self.prefix}-generator-{self._made}"
        self._made += 1
        res = self.resources
        options: dict[str, Any] = dict(
            name=name,
            max_concurrency=1024,
            max_restarts=self.max_restarts,
            max_task_retries=0,
            runtime_env={"env_vars": res.env_vars()},
            **res.ray_options(),
        )
        node, strategy = spread_choice(self.handles, self.chosen_nodes, self.resources.bundle(), self.reserved)
        if node is not None:  # replicas on different nodes where there are several (soft: Ray may still move it)
            options["scheduling_strategy"] = strategy
            self.chosen_nodes[name] = node
        handle: ReplicaHandle
        if self.is_async:
            from hydra.utils import get_class

            # The class _target_ names: the async engine or a subclass of it (generator_spec.is_async_engine).
            engine = get_class(self.spec["_target_"])
            kwargs = {k: v for k, v in self.spec.items() if k != "_target_"}
            handle = cast(
                ReplicaHandle,
                ray.remote(engine)
                .options(**options)
                .remote(**kwargs, await_weights=await_weights, setup=res.pinned(dict)),
            )
        else:
            handle = cast(
                ReplicaHandle,
                ray.remote(GeneratorServer)
                .options(**options)
                .remote(res.pinned(functools.partial(instantiate_spec, self.spec)), await_weights=await_weights),
            )
        self.handles[name] = handle
        self.versions[name] = -1 if await_weights else 0
        return name

    def wait_ready(self, names: list[str]) -> None:
        import ray

        try:
            ray.get([self.handles[n].max_model_len.remote() for n in names])
        except ray.exceptions.RayActorError as exc:
            cause = getattr(exc, "error_msg", None) or str(exc)
            raise RuntimeError(f"a generator replica failed to start: {cause.strip().splitlines()[-1]}") from None

    @property
    def first(self) -> ReplicaHandle:
        return self.handles[self.names[0]]

    @property
    def names(self) -> list[str]:
        return sorted(self.handles, key=lambda n: int(n.rsplit("-", 1)[1]))

    def serving(self) -> list[str]:
        return [n for n in self.names if n in self.router.replicas]

    def acked(self) -> int:
        """The version every serving replica has (admission counts staleness from it)."""
        live = [self.versions[n] for n in self.serving()]
        return min(live) if live else max(self.versions.values(), default=0)

    def start_at(self, version: int) -> None:
        """Every replica holds ``version``'s weights: the run's start, the initial or resumed weights loaded."""
        self.versions = {name: version for name in self.versions}

    def all_down(self) -> bool:
        return not self.router.replicas

    # ----------------------------------------------------------- weights
    def publish(self, version: int, weights: Any = None, metadata: list | None = None) -> list:
        """``version`` to every replica: from the broadcast group (``metadata``) or the object store
        (``weights``: the learner's WeightManifest, weights/buckets.py; each replica fetches and
        loads its buckets one at a time)."""
        refs = []
        self.published_version = max(self.published_version, int(version))
        for name in self.names:
            if name in self.restoring:
                continue  # it gets the latest weights when its restore runs
            handle = self.handles[name]
            if metadata is not None:
                ref = handle.update_weights_from_group.remote(version, metadata)
            else:
                ref = handle.update_weights.remote(version, weights)
            self.pending[ref] = (name, version, time.perf_counter())
            refs.append(ref)
        return refs

    def published(self, ref) -> float | None:
        """A replica confirmed (or failed) an update; seconds it took from the publish, or None."""
        import ray

        if ref not in self.pending:
            return None  # given up as overdue
        name, version, started = self.pending.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayError as exc:
            log.warning("generator replica %s failed the update to v%d: %s", name, version, exc.__class__.__name__)
            if name in self.handles and not self._engine_dead(name, exc):
                self._take_out(name)  # it holds its requests until the restore brings a whole version
            return None
        self.versions[name] = max(self.versions.get(name, 0), version)
        self._send_canary(name, version)
        return time.perf_counter() - started

    # ------------------------------------------------------------ canary
    def watch_canary(self, token_ids: list[int], max_diff: float) -> None:
        """Score ``token_ids`` on each replica after each confirmed update (the weight-sync canary);
        a replica off the learner's logprobs by more than ``max_diff`` nats failed its sync."""
        self.canary_ids, self.canary_max_diff = list(token_ids), float(max_diff)

    def expect(self, version: int, logprobs: list[float]) -> None:
        """The learner's canary logprobs at ``version`` (the version about to be published)."""
        self._expected = (int(version), [float(x) for x in logprobs])

    def _send_canary(self, name: str, version: int) -> None:
        if self.canary_ids and self._expected is not None and self._expected[0] == version and name in self.handles:
            self.canaries[self.handles[name].prompt_logprobs.remote(self.canary_ids)] = (
                name,
                version,
                self._expected[1],
            )

    def poll_canaries(self) -> None:
        """Compare the replicas' canaries that are in; one off by more than canary_max_diff is
        treated as failed: named, taken out of the router, restarted and re-synced."""
        import ray

        if not self.canaries:
            return
        ready, _ = ray.wait(list(self.canaries), num_returns=len(self.canaries), timeout=0)
        for ref in ready:
            name, version, want = self.canaries.pop(ref)
            try:
                got = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # the replica died; its restore re-syncs it
            diff = canary_gap(got, want)
            prev = self.counters.canary_max_diff
            self.counters.canary_max_diff = diff if prev is None else max(prev, diff)
            if diff > self.canary_max_diff and name in self.handles:
                self.counters.canary_failures += 1
                self.counters.failed_replicas.append(name)
                log.error(
                    "generator replica %s: logprobs after the update to v%d differ from the learner's by %.3g "
                    "(> %.3g): treated as failed, restarted and re-synced",
                    name,
                    version,
                    diff,
                    self.canary_max_diff,
                )
                self._take_out(name)
                kill(self.handles[name], no_restart=False)

    def overdue(self) -> None:
        """Updates not confirmed within the timeout: name the replica, take it out, restart it."""
        import ray

        now = time.perf_counter()
        for ref, (name, version, started) in list(self.pending.items()):
            if ref not in self.pending or now - started < self.update_timeout_s:
                continue
            if ray.wait([ref], timeout=0)[0]:
                continue  # it did answer; the driver has not read it yet (published() will)
            for other in [r for r, (n, _, _) in self.pending.items() if n == name]:
                del self.pending[other]  # its later updates too: the restore brings it the latest weights
            self.counters.update_timeouts += 1
            self.counters.failed_replicas.append(name)
            log.error(
                "generator replica %s did not confirm the update to v%d within %.0f s: taken out of the router "
                "and restarted",
                name,
                version,
                self.update_timeout_s,
            )
            self._take_out(name)
            if name in self.handles:
                kill(self.handles[name], no_restart=False)  # Ray restarts it; the probe re-syncs it

    def _take_out(self, name: str) -> None:
        self.router.remove(name)
        self.restoring.add(name)

    def replica_lost(self, name: str) -> None:
        """A group failed because its replica is gone (GeneratorUnavailable): restore it when it is back."""
        if name in self.handles:
            self._take_out(name)

    def check(self, latest: Callable[[], tuple[Any, int]], force: bool = False, every_s: float = 2.0) -> list[str]:
        """Probe every replica (every ``every_s``; at once when ``force``): one Ray restarted
        comes back with the base weights and holds its requests, so it leaves the router and
        gets the latest weights (``latest()`` -> (weights ref, version)) before it rejoins.
        Restores run while the driver goes on (``force`` waits for them). Returns the
        replicas restored now."""
        import ray

        now = time.monotonic()
        for name in self.names:
            if name in self.restores or name in self.probes:
                continue
            if force or name in self.restoring or now - self._probed.get(name, 0.0) > every_s:
                self.probes[name] = (self.handles[name].awaiting_weights.remote(), now)
                self._probed[name] = now
        for name, (ref, _) in list(self.probes.items()):
            ready, _ = ray.wait([ref], timeout=30.0 if force else 0)
            if not ready:
                continue
            del self.probes[name]
            try:
                awaiting = ray.get(ref)
            except ray.exceptions.RayError as exc:
                # Restarting (RayActorError), or its worker killed under it (OutOfMemoryError: Ray's
                # memory monitor): out of the router until it answers; the driver goes on.
                if self._engine_dead(name, exc):
                    continue
                self.deaths.failed(name, isinstance(exc, ray.exceptions.ActorDiedError), self.chosen_nodes.get(name))
                if not isinstance(exc, ray.exceptions.RayActorError):
                    log.warning("generator replica %s did not answer its probe (%s)", name, exc.__class__.__name__)
                if name in self.handles:
                    self._take_out(name)
                continue
            self.deaths.answered(name)
            if name not in self.handles or not (awaiting or name in self.restoring):
                continue
            self._take_out(name)
            weights, version = latest()
            self.restores[name] = (
                self.handles[name].update_weights.remote(version, weights),
                version,
                time.monotonic(),
            )
        return self._finish_restores(latest, block=force)

    def _finish_restores(self, latest: Callable[[], tuple[Any, int]], block: bool) -> list[str]:
        import ray

        restored = []
        for name, (ref, version, started) in list(self.restores.items()):
            ready, _ = ray.wait([ref], timeout=self.update_timeout_s if block else 0)
            if not ready:
                if time.monotonic() - started > self.update_timeout_s:
                    del self.restores[name]
                    log.error(
                        "generator replica %s did not load the weights to restore within %.0f s: restarted",
                        name,
                        self.update_timeout_s,
                    )
                    if name in self.handles:
                        kill(self.handles[name], no_restart=False)
                continue
            del self.restores[name]
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                if not self._engine_dead(name, exc):
                    log.warning("restoring generator replica %s failed (%s); retrying", name, exc.__class__.__name__)
                continue
            if name not in self.handles:
                continue  # retired meanwhile
            if version < self.published_version:  # a publish went out while it loaded: catch up first
                weights, newest = latest()
                self.restores[name] = (
                    self.handles[name].update_weights.remote(newest, weights),
                    newest,
                    time.monotonic(),
                )
                continue
            self.versions[name] = version
            self.restoring.discard(name)
            self.router.add(name)
            self.counters.restores += 1
            restored.append(name)
            log.warning("generator replica %s is serving with policy v%d", name, version)
        return restored

    def _engine_dead(self, name: str, exc: Exception) -> bool:
        """A replica whose engine core died inside its live actor answers every call with
        ``ReplicaEngineDead`` and would be restored for ever: restart it (Ray starts a new process,
        the probe then restores it). True when that was the error."""
        if not isinstance(exc, ReplicaEngineDead) or name not in self.handles:
            return False
        self._take_out(name)
        self.counters.engine_restarts += 1
        self.counters.failed_replicas.append(name)
        log.error("generator replica %s: its vLLM engine core is dead; restarted", name)
        kill(self.handles[name], no_restart=False)
        return True

    def weight_group_size(self) -> int:
        """The learner's rank 0 and every worker of every replica."""
        return 1 + len(self.names) * self.tp

    def join_weight_group(self, host: str, port: int, backend: str, timeout_s: float) -> tuple[int, list]:
        """Every replica joins the learner's group: replica i's workers are ranks 1 + i x TP ..;
        returns (world size, the join refs: they block until the learner joins too, at most
        ``timeout_s``: the learner's, so both sides of the group wait alike)."""
        world = self.weight_group_size()
        refs = [
            self.handles[n].join_weight_group.remote(host, port, world, backend, 1 + i * self.tp, timeout_s)
            for i, n in enumerate(self.names)
        ]
        return world, refs

    # ------------------------------------------------------------ scaling
    def scale(self, count: int, latest: Callable[[], tuple[Any, int]]) -> None:
        """Serve with ``count`` replicas: new ones get the current weights before they serve;
        the newest retire (no new group; stopped by ``reap`` once their groups end)."""
        if count < 1:
            raise ValueError(f"generators must be >= 1, got {count}")
        while len(self.handles) < count:
            name = self._start(await_weights=True)
            self.wait_ready([name])
            self.restoring.add(name)  # check() gives it the weights, then the router takes it
            self.router.remove(name)
            deadline = time.monotonic() + self.update_timeout_s
            while name not in self.router.replicas and time.monotonic() < deadline:
                self.check(latest, force=True)  # a probe or load that fails (or is slow) is retried
            if name not in self.router.replicas:
                raise ValueError(
                    f"generator replica {name} did not load the current weights within "
                    f"{self.update_timeout_s:.0f} s; the run goes on with {len(self.router.replicas)}"
                )
        while len(self.handles) > count:
            name = self.names[-1]
            self.router.remove(name)
            self.restoring.discard(name)
            self.restores.pop(name, None)
            self.retiring[name] = self.handles.pop(name)
            log.info("generator replica %s retiring", name)

    def reap(self) -> None:
        import ray

        for name in list(self.retiring):
            if self.router.groups_on(name) or any(n == name for n, _, _ in self.pending.values()):
                continue
            handle = self.retiring.pop(name)
            try:  # its final count, for the run's token books: what it made since the last reading
                final = ray.get(handle.stats.remote(), timeout=10.0)
                self.token_count.read({name: (final.instance, final.generated_tokens)})
            except (ray.exceptions.RayError, TimeoutError):
                self._count_short = True  # its last tokens are nowhere: the run's count stays unknown
            kill(handle, no_restart=True)
            self.versions.pop(name, None)
            self.counters.retired += 1
            log.info("generator replica %s retired", name)

    # ------------------------------------------------------------ metrics
    def stats(self, timeout_s: float = 10.0) -> dict[str, ReplicaStats]:
        """Each replica's counters (requests, tokens, load, prefix hits); a replica that does not answer
        is left out. The replicas retiring are read too, for the run's token count (``generated_tokens``)."""
        import ray

        handles = {**self.handles, **self.retiring}
        refs = {name: handle.stats.remote() for name, handle in handles.items()}
        out: dict[str, ReplicaStats] = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=timeout_s)
            except (ray.exceptions.RayError, TimeoutError):
                continue
        self.token_count.read({name: (s.instance, s.generated_tokens) for name, s in out.items()})
        self._count_read_all = len(out) == len(refs)
        return {name: out[name] for name in self.names if name in out}

    def generated_tokens(self) -> int | None:
        """The tokens the replicas generated since the fleet started, restarted and retired ones
        included, as of the latest ``stats()``; None when a replica did not answer it."""
        return self.token_count.total if self._count_read_all and not self._count_short else None

    def close(self) -> None:

        for handle in [*self.handles.values(), *self.retiring.values()]:
            try:
                kill(handle, no_restart=True)
            except Exception:  # already gone
                pass
