"""Env actor: a CPU worker that plays GRPO groups against the shared generator.

Each ``run_group`` job runs n episodes of one task in lockstep (actors/rollout),
asking the generator actor for every completion, and streams the finished
trajectories to the replay server over ZeroMQ. The training interface comes
from the coordinator: read once at start (so a restarted actor is current)
and replaced whenever the coordinator pushes a new version; a group always
plays under one interface version.

Runs as a Ray actor with two concurrent calls, so a pushed interface update
or a ``pid`` probe is answered while a group plays.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from actors.generation.server import RemoteGenerator
from env_pool.base import Environment
from env_pool.interface.state import InterfaceState
from replay.auth import ClientKeys
from replay.control_messages import LOST_TOKENS_ATTR, GroupJob, GroupReport, GroupStats, InterfaceUpdate
from replay.transport import TrajectorySender
from rollout.chat import ChatTokenizer
from rollout.generator import GeneratorUnavailable, SamplingConfig
from rollout.play import run_group

COORDINATOR_TIMEOUT_S = 300.0  # reading the interface at start; the coordinator answers from memory


class EnvActor:
    def __init__(
        self,
        name: str,
        make_env: Callable[[], Environment],
        make_tokenizer: Callable[[], Any],
        generator: Any,
        coordinator: Any,
        replay_address: str,
        sampling: SamplingConfig,
        hwm: int,  # hwm and send_timeout_s: the transport group's
        send_timeout_s: float,
        keys: ClientKeys | None = None,
        lockstep: bool = True,
        chat_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``keys``: this run's CURVE keys for the replay stream (None when it runs without CURVE).
        ``lockstep``: a group's turns go out as one batch (blocking engines); False: each
        episode's as soon as it is ready (continuous batching)."""
        import ray

        # Peers come by name (or handle): a name keeps this actor's constructor
        # arguments small and plain, which Ray needs to restart it after a crash.
        coordinator = ray.get_actor(coordinator) if isinstance(coordinator, str) else coordinator
        self.name = name
        self.make_env = make_env
        self.sampling = sampling
        self.lockstep = lockstep
        self.chat = ChatTokenizer(make_tokenizer(), **(chat_options or {}))  # model.family, chat_template_kwargs
        self._generators: dict[str, RemoteGenerator] = {}  # replica name -> client (the router picks per group)
        self._default_generator = generator if isinstance(generator, str) else ""
        self.generator = self._generator_for("") if isinstance(generator, str) else RemoteGenerator(generator)
        self.sender = TrajectorySender(replay_address, hwm=hwm, send_timeout_s=send_timeout_s, keys=keys)
        self._lock = threading.Lock()
        try:  # the coordinator answers from memory: minutes mean it is gone
            update: InterfaceUpdate = ray.get(coordinator.interface.remote(), timeout=COORDINATOR_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"env actor on {ray.util.get_node_ip_address()}: the coordinator sent no interface "
                f"in {COORDINATOR_TIMEOUT_S:.0f} s"
            ) from None
        self.interface = InterfaceState.from_dict(update.state.to_dict())
        self.groups = 0

    def set_interface(self, update: InterfaceUpdate) -> int:
        """Coordinator push; versions only move forward (pushes may cross)."""
        with self._lock:
            if update.version > self.interface.version:
                self.interface = InterfaceState.from_dict(update.state.to_dict())
            return self.interface.version

    def run_group(self, job: GroupJob) -> GroupReport:
        t0 = time.perf_counter()
        with self._lock:
            interface = self.interface
        stats = GroupStats()
        generator = self._generator_for(job.generator) if job.generator else self.generator
        try:
            trajectories = run_group(
                self.make_env,
                generator,
                self.chat,
                job.task_id,
                job.n,
                self.sampling,
                interface,
                group_id=job.group_id,
                seed=job.seed,
                stats=stats,
                lockstep=self.lockstep,
                deadline_s=job.episode_deadline_s,
                pinned=job.episode_version == "pinned",
                reference=job.reference_logprobs == "generator",
            )
        except Exception as exc:
            # Nothing of the group was sent: the driver counts these tokens lost (seal/run/dispatch.py).
            setattr(exc, LOST_TOKENS_ATTR, stats.generated_tokens)
            raise
        t_send = time.perf_counter()
        for traj in trajectories:
            self.sender.send(traj)
        send_s = time.perf_counter() - t_send
        self.groups += 1
        return GroupReport(
            slot=job.slot,
            group_id=job.group_id,
            task_id=job.task_id,
            actor=self.name,
            sent=len(trajectories),
            interface_version=interface.version,
            start_version=min(t.start_version for t in trajectories),
            generation=stats,
            env_s=sum(t.timings.get("env_s", 0.0) + t.timings.get("judge_s", 0.0) for t in trajectories),
            send_s=send_s,
            wall_s=time.perf_counter() - t0,
            env_steps=sum(t.num_steps for t in trajectories),
            tool_calls=sum(t.num_tool_calls for t in trajectories),
            rewards=tuple(float(t.reward) for t in trajectories),
            faults=tuple(t.infra_fault.kind if t.infra_fault else "" for t in trajectories),
        )

    def _generator_for(self, name: str):
        import ray

        name = name or self._default_generator
        if name not in self._generators:
            try:
                handle = ray.get_actor(name)
            except ValueError:  # retired or gone for good: the driver re-issues the group
                raise GeneratorUnavailable(f"generator replica {name} is not running") from None
            self._generators[name] = RemoteGenerator(handle)
        return self._generators[name]

    def close(self) -> int:
        """Before this actor is stopped: deliver the trajectories still queued in
        the sender (a kill would drop them, and their group would wait for its
        re-issue timeout). Returns the frames sent over the actor's life."""
        self.sender.close()
        return self.sender.sent

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
