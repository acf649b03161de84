"""The actor-learner pipeline on Ray: the orchestrator that wires the components.

    env actors (CPU, many) --generate--> generator actor (vLLM)
    env actors --trajectories, ZeroMQ + msgpack--> replay server (this process)
    replay server --complete groups--> learner actor (DeepSpeed ZeRO)
    learner --weights (object store)--> generator; coordinator <-- tag summaries
    coordinator --tag weights--> learner, --interface versions--> env actors

This process owns the task stream (replay/slots.py), the replay queue behind its
ZeroMQ socket, the control socket `seal scale` talks to, the metrics and the
checkpoints. Sync and async mode are the same loop: sync admits one batch of
groups per acknowledged policy version and waits for each publish and
interface push; async admits ``max_staleness`` batches more and never waits.

The loop's parts: rollout jobs to env actors (seal/run/dispatch.py), batches to the
learner and the end of each step (seal/run/learner_steps.py), weights to the generator
replicas (seal/runtime/publisher.py), the run's position, checkpoints and snapshots
(seal/run/run_state.py), one metrics row per step (seal/run/step_metrics.py).
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from actors.generation.engine_settings import EngineSettings
from actors.generation.episode_pins import pinned_episodes_problem
from replay.auth import RunKeys
from replay.queue import ReplayQueue
from replay.slots import SlotLedger
from replay.transport import ReplayServer
from seal.config import Settings, TrainerConfig, instantiate
from seal.run.dispatch import Dispatcher
from seal.run.learner_steps import LearnerSteps
from seal.run.progress import Progress, engines_text
from seal.run.run_log import RunLog
from seal.run.run_state import DriverState, RunState
from seal.run.step_metrics import RunFacts, StepWindow, replica_metrics
from seal.run.task_fit import select_tasks
from seal.runtime.actor_set import ActorSet
from seal.runtime.calls import COORDINATOR_TIMEOUT_S, bounded_get
from seal.runtime.control import ControlServer
from seal.runtime.generator_spec import is_async_engine
from seal.runtime.placement import check_reachable, start_ray
from seal.runtime.publisher import WeightPublisher
from seal.runtime.ray_leftovers import end_leftovers, watch_session
from seal.runtime.storage import record_storage, resume_checkpoint, run_storage

RECENT_ROWS = 100  # step rows Pipeline.run returns (tests read them); the run's record is metrics.jsonl


class Pipeline:
    # The weight publisher's class (seal/commands/rehearse_probe.py uses one that records the weight groups it forms).
    publisher_type: type[WeightPublisher] = WeightPublisher
    # Set as __init__ starts each (absent before: close() after a failed start skips them).
    replay: ReplayServer
    actors: ActorSet
    control: ControlServer

    def __init__(
        self,
        cfg,
        run_dir: Path,
        resume: Path | None = None,
        progress: Progress | None = None,
        tasks: tuple[list[str], int] | None = None,
        settings: Settings | None = None,
    ) -> None:
        """``tasks``: (task ids, overlong ones skipped) from ``select_tasks``, when the caller already chose them;
        ``settings``: ``cfg``'s typed groups, when the caller's preflight built them (None: built and checked here)."""
        import ray

        self.settings = settings or check_pipeline_config(cfg)  # every typed group the run reads
        self.trainer = t = self.settings.trainer
        self.learner_group, self.fleet = self.settings.learner, self.settings.generator
        self.cfg, self.run_dir = cfg, run_dir
        self.progress = progress or Progress(quiet=True)
        self.cluster = instantiate(cfg.cluster)
        self.task_ids, self.skipped_overlong = tasks or select_tasks(cfg)
        # Checkpoints and snapshot weights (trainer.storage: a path every node sees; seal/runtime/storage.py).
        self.storage = run_storage(run_dir, t.storage)
        record_storage(run_dir, self.storage)
        self._owns_ray = not ray.is_initialized()  # tests share one Ray session across pipelines
        self.ledger = SlotLedger(
            self.task_ids,
            cfg.n,
            t.groups_per_step,
            t.staleness,
            cfg.seed,
            oversample=t.admission_oversample,
            episode_deadline_s=t.episode_deadline_s,
            episode_version=t.episode_version,
            reference_logprobs=t.reference_logprobs,
        )
        queue = replay_queue(cfg, t)
        self.window = StepWindow(
            t.mode,
            int(cfg.sampling.max_new_tokens),
            self.learner_group.world_size,
            self.fleet.replicas,
            self.skipped_overlong,
        )
        self.keys: RunKeys | None = None
        try:
            local = self._owns_ray and not self.cluster.address  # a session this driver starts, and only it ends
            if local:  # what a SIGKILLed driver of this run directory left of its session
                end_leftovers(run_dir, lambda text: self.progress.emit("ray", text))
            with self.progress.timed("ray", f"starting Ray ({self.cluster.address or 'local'})", "Ray up"):
                start_ray(
                    self.cluster,
                    learner_ranks=self.learner_group.world_size,
                    replicas=self.fleet.replicas,
                )
            if local:
                watch_session(run_dir)  # a guard ends the session's leftovers if this driver is killed
            check_reachable(self.cluster)
            transport = instantiate(cfg.transport)
            # This run's CURVE keys (replay/auth.py), in this process's memory: env actors get
            # theirs through Ray, `seal scale` from a 0600 file outside the run dir (seal/runtime/control.py).
            self.keys = RunKeys.generate() if transport.curve else None
            self.replay = ReplayServer(queue, transport, self.keys)
            with self.progress.timed(
                "engine", f"starting {engines_text(self.settings)}", "generator and learner ready"
            ):
                self.actors = ActorSet(
                    cfg,
                    self.settings,
                    self.cluster,
                    self.replay.address,
                    storage=str(self.storage),
                    replay_keys=self.replay.client_keys,
                )
            self._start(resume)
        except BaseException:
            self.close()  # no actor, socket or Ray session outlives a failed start
            raise

    def _start(self, resume: Path | None) -> None:
        t, actors = self.trainer, self.actors
        resumed = (
            DriverState.from_dict(actors.learners.load_checkpoint(str(resume_checkpoint(resume))))
            if resume is not None
            else None
        )
        actors.start_coordinator(
            resumed.coordinator if resumed else None,
            closed_loop=t.closed_loop,
            per_category=t.per_category_guidelines,
        )
        self.state = RunState(
            self.run_dir, self.storage, actors, self.progress, str(self.cfg.model.path), t.checkpoint_keep, resumed
        )
        if resumed:
            self.ledger.restore(resumed.slots, self.state.version)
            self.replay.set_policy_version(self.state.version)
            actors.learners.step = resumed.step  # its errors name the run's step, not this invocation's count
        self.publisher = self.publisher_type(
            fleet=actors.generators,
            learners=actors.learners,
            version=self.state.version,
            broadcast=self.fleet.weight_sync == "broadcast",
            backend=self.learner_group.process_group_backend,  # the weight group's follows the learner's device
            canary_model=str(self.cfg.model.path) if t.weight_canary else None,
            canary_max_diff=t.canary_max_logprob_diff,
        )
        self.publisher.start(resumed=resumed is not None)
        if resumed is None and self.state.needs_base_snapshot():
            self.state.snapshot(initial=True)
        lc = self.learner_group.cfg
        self.dispatch = Dispatcher(
            actors,
            self.ledger,
            self.replay,
            self.publisher,
            self.window,
            self.progress,
            int(self.cfg.sampling.max_new_tokens),
            t.filter_groups == "zero_variance",
        )
        self.learning = LearnerSteps(
            t,
            self.state,
            actors,
            self.replay,
            self.ledger,
            self.publisher,
            self.window,
            self.progress,
            lc.mini_batch_groups,
            lc.old_logprobs,
        )
        with self.progress.timed("env", f"starting {self.cluster.env_actors} env actors", "env actors ready"):
            actors.scale_env(self.cluster.env_actors)
        self._record_placement()
        self.control = ControlServer(self.run_dir, self.cluster.bind_host, self.keys, replay=self.replay.address)

    def _record_placement(self) -> None:
        """RUN_DIR/placement.json and one progress line: which node each actor started on."""
        where = self.actors.placement()
        (self.run_dir / "placement.json").write_text(json.dumps(where, indent=2))
        by_node: dict[str, list[str]] = {}
        for kind, actors in where.items():
            for name, ip in actors.items():
                by_node.setdefault(ip, []).append(
                    name if kind in ("env", "generator", "coordinator") else f"{kind} {name}"
                )
        self.progress.emit("placement", "; ".join(f"{ip}: {', '.join(names)}" for ip, names in sorted(by_node.items())))

    # ------------------------------------------------------------ main loop
    def run(self, steps: int) -> list[dict[str, Any]]:
        """Train ``steps`` steps; returns the last ``RECENT_ROWS`` step rows (every row is in metrics.jsonl).
        A row is ~16 KB in memory: all of them kept, the driver grew 18 MB over a 45-minute soak's
        1850 steps, without bound on a long run."""
        runlog, t = RunLog(self.run_dir), self.trainer
        history: deque[dict[str, Any]] = deque(maxlen=RECENT_ROWS)
        target = self.state.step + steps
        guidelines = None  # the step lines show guideline changes against the interface the run starts with
        if not self.progress.quiet:
            update = bounded_get(
                self.actors.coordinator.interface.remote(),
                COORDINATOR_TIMEOUT_S,
                "coordinator interface at the run's start",
            )
            guidelines = list(update.state.active_guidelines)
        self.progress.run_started(target, t.groups_per_step, guidelines)
        try:
            while self.state.step < target:
                self.control.poll(self._on_control)
                self.dispatch.fill()
                self._wait_some()
                self.publisher.check()
                outcome = self.learning.advance()
                if outcome is None:
                    continue
                last = self.state.step >= target  # the run's end closes the token books: groups playing come back
                if last:
                    self.dispatch.drain()
                self.dispatch.settle(self.window.awaiting_reports())  # a step's figures are its groups' (step_metrics)
                undecided = self.replay.undecided_tokens() if last else None
                record = self.window.row(outcome, self._facts(), time.perf_counter(), undecided)
                row = record.row
                self.state.count_tokens(0, record.rollout_tokens)
                history.append(row)
                runlog.write(row, record.interface)
                self.progress.step_done(row)
                step = self.state.step  # a checkpoint also at the run's last step, so resume= always can
                if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == target):
                    self.state.checkpoint(self.ledger.state())
                if (t.snapshot_every and step % t.snapshot_every == 0) or step == target:
                    self.state.snapshot(metrics=row)
        finally:
            runlog.close()
        return list(history)

    def _wait_some(self) -> None:
        """Until a job, an update or the learner's call ends (at most 0.1 s), then what expired."""
        import ray

        refs = self.dispatch.refs() + list(self.publisher.in_flight) + self.learning.refs()
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=0.1)
            self.dispatch.collect(ready)
            self.publisher.collect(ready)
        else:
            time.sleep(0.05)
        self.dispatch.expire()  # also with nothing out: a group short of members by infra faults waits for it

    def _facts(self) -> RunFacts:
        fleet = self.actors.generators
        replicas = fleet.stats()  # a replica that does not answer (restarting) is left out
        counters = self.ledger.counters
        return RunFacts(
            step=self.state.step,
            policy_version=self.state.version,
            env_actors=self.actors.target_env,
            filtered_total=counters.filtered,
            reissued=counters.reissued,
            given_up=counters.given_up,
            replay=self.replay.counters(),
            control_unauthorized=self.control.unauthorized,
            weight_rounds_failed=len(self.actors.learners.survivable_failures),
            publish_s=self.publisher.publish_s,
            generator_restores=self.publisher.restores,
            replicas=replicas,
            generated_tokens=fleet.generated_tokens(),  # as of the stats() just read
            replica_count=len(fleet.handles),
            fleet=replica_metrics(fleet, replicas),
        )

    # ------------------------------------------------------------ control
    def _on_control(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        if command == "scale":
            for key in ("env", "generators"):
                if key in args and (not isinstance(args[key], int) or args[key] < 1):
                    raise ValueError(f"scale needs {key}=N with N >= 1, got {args[key]!r}")
            if "env" in args:
                self.actors.scale_env(args["env"])
            if "generators" in args:
                self.publisher.scale(args["generators"])
            return {"env_actors": self.actors.target_env, "generators": len(self.actors.generators.handles)}
        if command == "status":
            return {
                "step": self.state.step,
                "policy_version": self.state.version,
                "env_actors": self.actors.target_env,
                "generators": len(self.actors.generators.handles),
                "in_flight": len(self.dispatch.jobs),
                **self.ledger.counters.__dict__,
                "unauthorized": {
                    "replay": self.replay.counters().server.unauthorized,
                    "control": self.control.unauthorized,
                },
                "replay_frames_by_peer": self.replay.counters().server.frames_by_peer,
            }
        raise ValueError(f"unknown control command {command!r} (scale, status)")

    def close(self) -> None:
        import ray

        for name in ("control", "replay", "actors"):
            if hasattr(self, name):
                getattr(self, name).close()
        if self._owns_ray:
            ray.shutdown()


def replay_queue(cfg, t: TrainerConfig) -> ReplayQueue:
    """The run's replay queue from the trainer settings (preflight builds one too: it checks them)."""
    return ReplayQueue(
        cfg.n,
        t.groups_per_step,
        max_staleness=t.staleness,
        stale_policy=t.stale_policy,
        reissue_after_s=t.reissue_after_s,
        filter_groups=t.filter_groups,
        min_group_size=t.min_group_size,
    )


def reference_problem(
    reference_logprobs: str, lora_rank: int | None, lora_publish: str | None, kl_coef: float
) -> str | None:
    """Why ``trainer.reference_logprobs=generator`` cannot work with these settings (None: it can, or
    it is not asked for): one line saying what to set."""
    if reference_logprobs != "generator":
        return None
    head = "trainer.reference_logprobs=generator takes the KL reference from the replicas' base model"
    if lora_rank is None:
        return (
            f"{head}, which is the reference only under LoRA (learner.cfg.lora.rank=R): with full training "
            "the replicas serve the trained weights, not the frozen reference"
        )
    if lora_publish != "adapter":
        return (
            f"{head}, which needs learner.cfg.lora.publish=adapter: with publish={lora_publish} the replicas "
            "load merged weights and no longer serve the base"
        )
    if not kl_coef:
        return f"{head}, but learner.cfg.loss.kl_coef is 0: there is no KL term to take it for"
    return None


def check_pipeline_config(cfg) -> Settings:
    """The checks no component makes of its own: the typed groups (seal/config.py), the learner
    group's size against its backend, and the guideline policy (built in the coordinator actor: it
    fails here, before anything starts). Returns the typed groups."""
    settings = Settings.of(cfg)
    trainer, learners = settings.trainer, settings.learner
    if trainer.min_group_size is not None and trainer.min_group_size > cfg.n:
        raise ValueError(f"trainer.min_group_size={trainer.min_group_size} is more than a group's n={cfg.n} rollouts")
    if learners.world_size > 1 and learners.backend != "deepspeed":
        raise ValueError(
            f"learner.world_size={learners.world_size} needs a DeepSpeed learner (learner=zero2 or learner=zero3)"
        )
    lora, gen = learners.cfg.lora, settings.generator
    pinning = pinned_episodes_problem(
        trainer.episode_version,
        is_async_engine(gen.target),
        lora.rank if lora is not None else None,
        lora.publish if lora is not None else None,
        gen.max_loras if gen.max_loras is not None else EngineSettings.max_loras,
    )
    if pinning:
        raise ValueError(pinning)
    reference = reference_problem(
        trainer.reference_logprobs,
        lora.rank if lora is not None else None,
        lora.publish if lora is not None else None,
        learners.cfg.loss.kl_coef,
    )
    if reference:
        raise ValueError(reference)
    instantiate(cfg.guideline_policy)
    return settings
