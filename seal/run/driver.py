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
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from replay.auth import RunKeys
from replay.messages import GroupJob, GroupReport, TagSummary
from replay.queue import ReplayQueue
from replay.transport import ReplayServer
from seal.config import instantiate
from seal.runtime.control import ControlServer
from seal.runtime.actor_set import ActorSet
from seal.runtime.placement import check_reachable, start_ray
from seal.run.progress import Progress, engines_text, learner_work
from seal.run.run_log import RunLog
from replay.slots import SlotLedger
from seal.run.snapshots import next_name, snapshot_root, write_snapshot
from seal.run.step_metrics import StepWindow
from seal.runtime.storage import checkpoint_dir, record_storage, resume_checkpoint, run_storage
from seal.run.task_fit import select_tasks

log = logging.getLogger(__name__)
# Scored by the learner and by every replica after each update (the weight-sync canary).
CANARY_TEXT = ("The canary checks that every generator replica loaded the learner's weights: "
               "call get_weather(city='Paris') and report the temperature in Celsius.")


class Pipeline:
    def __init__(self, cfg, run_dir: Path, resume: Path | None = None, progress: Progress | None = None,
                 tasks: tuple[list[str], int] | None = None) -> None:
        """``tasks``: (task ids, overlong ones skipped) from ``select_tasks``, when the caller already chose them."""
        import ray

        t = cfg.trainer
        check_trainer_config(cfg)
        self.cfg, self.run_dir, self.sync = cfg, run_dir, t.mode == "sync"
        self.progress = progress or Progress(quiet=True)
        self.cluster = instantiate(cfg.cluster)
        self.task_ids, self.skipped_overlong = tasks or select_tasks(cfg)
        # Checkpoints and snapshot weights (trainer.storage: a path every node sees; seal/runtime/storage.py).
        self.storage = run_storage(run_dir, t.get("storage"))
        record_storage(run_dir, self.storage)
        self._owns_ray = not ray.is_initialized()  # tests share one Ray session across pipelines
        staleness = 0 if self.sync else int(t.max_staleness)
        self.ledger = SlotLedger(self.task_ids, cfg.n, t.groups_per_step, staleness, cfg.seed, oversample=int(t.oversample))
        queue = ReplayQueue(cfg.n, t.groups_per_step, max_staleness=staleness, stale_policy=t.stale_policy,
                            reissue_after_s=t.reissue_after_s, filter_groups=t.filter_groups)
        self.keys: RunKeys | None = None
        self.replay: ReplayServer | None = None
        self.actors: ActorSet | None = None
        self.control: ControlServer | None = None
        self.jobs: dict[Any, tuple[GroupJob, str]] = {}  # job ref -> (job, env actor name)
        self.learn: tuple[Any, list, float] | None = None  # (the learner group's call, groups, started)
        self.window = StepWindow()
        self.publishing: dict[Any, int] = {}  # one replica's update ref -> version (the fleet knows which replica)
        self.publish_s: float | None = None  # the latest completed publish: learner done -> generator loaded
        self._skipped_row: dict[str, Any] | None = None  # a step skipped for want of groups with reward variance
        try:
            with self.progress.timed("ray", f"starting Ray ({self.cluster.address or 'local'})", "Ray up"):
                start_ray(self.cluster, learner_ranks=int(cfg.learner.get("world_size", 1)), replicas=int(cfg.generator.get("replicas", 1)))
            check_reachable(self.cluster)
            transport = instantiate(cfg.transport)
            # This run's CURVE keys (replay/auth.py), in this process's memory: env actors get
            # theirs through Ray, `seal scale` from a 0600 file outside the run dir (seal/runtime/control.py).
            self.keys = RunKeys.generate() if transport.curve else None
            self.replay = ReplayServer(queue, transport, self.keys)
            with self.progress.timed("engine", f"starting {engines_text(cfg)}", "generator and learner ready"):
                self.actors = ActorSet(cfg, self.cluster, self.replay.address, storage=str(self.storage),
                                       replay_keys=self.replay.client_keys)
            self._start(resume)
        except BaseException:
            self.close()  # no actor, socket or Ray session outlives a failed start
            raise

    def _start(self, resume: Path | None) -> None:
        import ray

        extra = None
        if resume is not None:
            extra = self.actors.learners.load_checkpoint(str(resume_checkpoint(resume)))
        self.actors.start_coordinator(extra["coordinator"] if extra else None)
        self.step = int(extra["step"]) if extra else 0
        self.version = int(extra["policy_version"]) if extra else 0
        # Cumulative cost, carried across resumes (snapshot records report it).
        self.totals = dict(extra.get("totals", {})) if extra else {}
        for key in ("wall_s", "update_tokens", "rollout_tokens"):
            self.totals.setdefault(key, 0.0)
        self.started = time.perf_counter()
        # The manifest of the last weights published through the object store, and their version:
        # holding it keeps their buckets in the store for replicas that restore or join later.
        self.weights_manifest = None
        self.weights_version = 0
        # Weights go to the generator in its dtype (bf16 on a CPU with it: half the bytes).
        self.weight_dtype = ray.get(self.actors.generator.dtype.remote())
        fleet = self.actors.generators
        if self.cfg.trainer.get("weight_canary", True):
            from weights.model_assets import load_tokenizer

            fleet.canary_ids = list(load_tokenizer(str(self.cfg.model.path))(CANARY_TEXT)["input_ids"])[:48]
            fleet.canary_max_diff = float(self.cfg.trainer.get("canary_max_logprob_diff", 1.0))
        if extra:
            self.ledger.restore(extra["slots"], self.version)
            self.replay.set_policy_version(self.version)
            self.weights_manifest, self.weights_version = self.actors.learners.weights(self.weight_dtype), self.version
            for ref in fleet.publish(self.version, self.weights_manifest):
                ray.wait([ref], timeout=None)
                fleet.published(ref)
        fleet.versions = {name: self.version for name in fleet.versions}
        self.acked = self.version  # the version every serving replica has
        self.broadcast = self.cfg.generator.get("weight_sync", "reload") == "broadcast"
        self.weight_meta: list | None = None
        if self.broadcast:
            self._form_weight_group()
        if extra is None and not (snapshot_root(self.run_dir) / "index.jsonl").exists():
            self.snapshot(initial=True)
        with self.progress.timed("env", f"starting {self.cluster.env_actors} env actors", "env actors ready"):
            self.actors.scale_env(self.cluster.env_actors)
        self._record_placement()
        self.control = ControlServer(self.run_dir, self.cluster.bind_host, self.keys, replay=self.replay.address)

    def _record_placement(self) -> None:
        """RUN_DIR/placement.json and one progress line: which node each actor started on."""
        import json

        where = self.actors.placement()
        (self.run_dir / "placement.json").write_text(json.dumps(where, indent=2))
        by_node: dict[str, list[str]] = {}
        for kind, actors in where.items():
            for name, ip in actors.items():
                by_node.setdefault(ip, []).append(name if kind in ("env", "generator", "coordinator") else f"{kind} {name}")
        self.progress.emit("placement", "; ".join(f"{ip}: {', '.join(names)}" for ip, names in sorted(by_node.items())))

    # ------------------------------------------------------------ main loop
    def run(self, steps: int) -> list[dict[str, Any]]:
        runlog, history = RunLog(self.run_dir), []
        target = self.step + steps
        guidelines = None  # the step lines show guideline changes against the interface the run starts with
        if not self.progress.quiet:
            import ray

            guidelines = ray.get(self.actors.coordinator.interface.remote()).state.get("active_guidelines", [])
        self.progress.run_started(target, int(self.cfg.trainer.groups_per_step), guidelines)
        try:
            while self.step < target:
                self.control.poll(self._on_control)
                self._dispatch()
                self._wait_some()
                self._check_generator()
                self._maybe_train()
                row = self._maybe_finish_step()
                if row is not None:
                    history.append(row)
                    runlog.write(row, row.pop("_interface"))
                    self.progress.step_done(row)
                    every_ckpt = self.cfg.trainer.checkpoint_every  # and at the run's last step, so resume= always can
                    if every_ckpt and (self.step % every_ckpt == 0 or self.step == target):
                        self.checkpoint()
                    every = self.cfg.trainer.snapshot_every
                    if (every and self.step % every == 0) or self.step == target:
                        self.snapshot(metrics=row)
        finally:
            runlog.close()
        return history

    def _dispatch(self) -> None:
        import dataclasses

        fleet = self.actors.generators
        if fleet.all_down():  # groups would only fail until a replica is back
            return
        while True:
            actor = self.actors.idle_env_actor(busy={name for _, name in self.jobs.values()})
            if actor is None:
                return
            job = self.ledger.next_job(self.acked)
            if job is None:
                return
            if self.ledger.starts_epoch(job):
                self.actors.coordinator.end_epoch.remote()
            name, handle = actor
            # The router fixes the group's replica (its prefix cache serves every turn and rollout);
            # the load it balances is the group's token budget.
            budget = job.n * (int(self.cfg.sampling.max_new_tokens) + 1)
            job = dataclasses.replace(job, generator=fleet.router.route(job.group_id, budget))
            self.jobs[handle.run_group.remote(job)] = (job, name)
            self.progress.group_started(job, name, self.acked)

    def _wait_some(self) -> None:
        import ray

        refs = list(self.jobs) + list(self.publishing) + (list(self.learn[0].refs) if self.learn else [])
        if not refs:
            time.sleep(0.05)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=0.1)
        for ref in ready:
            if ref in self.jobs:
                self._job_done(ref)
            elif ref in self.publishing:
                self._published(ref)
        for gid, _task in self.replay.expired():
            if gid in self.ledger.in_flight:
                self.ledger.failed(gid)

    def _job_done(self, ref) -> None:
        import ray

        from rollout.generator import GeneratorUnavailable

        job, name = self.jobs.pop(ref)
        self.actors.generators.router.release(job.group_id)
        try:
            report: GroupReport = ray.get(ref)
        except (ray.exceptions.RayActorError, GeneratorUnavailable, ray.exceptions.RayTaskError) as exc:
            # A crash (kill -9, node loss, a dead generator: Ray restarts it)
            # says nothing about the task; any other task error counts toward
            # the slot's bounded retries. Either way the group is given up and
            # its slot re-issued.
            crash = isinstance(exc, (ray.exceptions.RayActorError, GeneratorUnavailable))
            log.warning("group %s (slot %d, task %s) lost on %s: %s", job.group_id, job.slot, job.task_id, name,
                        exc.__class__.__name__ if crash else exc)
            self.window.note_failure(exc)
            if job.group_id in self.ledger.in_flight and self.replay.abandon(job.group_id):
                self.ledger.failed(job.group_id, crash=crash)
            if isinstance(exc, ray.exceptions.RayActorError):
                self.actors.crashed(name)
            if isinstance(exc, GeneratorUnavailable):
                self.actors.generators.replica_lost(job.generator)
                self._check_generator(force=True)
            return
        if job.group_id in self.ledger.in_flight:
            self.window.add_report(report)
            equal = self.cfg.trainer.filter_groups == "zero_variance" and len(set(report.rewards)) == 1
            self.progress.group_done(report, filtered=equal, in_flight=len(self.jobs))

    def _check_generator(self, force: bool = False) -> None:
        """Replicas whose update is overdue are restarted; restarted ones get the latest
        weights before they serve again (seal/runtime/generator_fleet.py)."""
        fleet = self.actors.generators
        fleet.overdue()
        for ref in [r for r in self.publishing if r not in fleet.pending]:
            self.publishing.pop(ref)  # given up as overdue
        fleet.poll_canaries()
        fleet.reap()
        restored = fleet.check(self._latest_weights, force=force, every_s=0.5 if fleet.all_down() else 2.0)
        if restored:
            self.window.generator_restores += len(restored)
            if self.broadcast:  # the restarted process left the group: re-form it with every replica
                self._form_weight_group()
        self.acked = max(self.acked, fleet.acked()) if not fleet.all_down() else self.acked

    def _latest_weights(self) -> tuple[Any, int]:
        """What a restored or new replica loads: the last published manifest when the object
        store carried it; with broadcast (or before any publish) the learner's current weights."""
        if self.weights_manifest is not None and not self.broadcast:
            return self.weights_manifest, self.weights_version
        return self.actors.learners.weights(self.weight_dtype), self.version

    def _record_tags(self, trajs) -> None:
        self.actors.coordinator.record.remote([TagSummary(t.task_id, t.category, t.tags, t.labels, t.reward, t.success,
                                                          t.progress, t.interface_version) for t in trajs])

    def _drain_filtered(self) -> None:
        """Zero-variance groups: their slots are done and their tags still shape the
        failure profile (the interface evolves from what the policy did, trained on or not)."""
        filtered = self.replay.drain_filtered()
        for g in filtered:
            self.ledger.filtered(g.group_id)
            self.window.add_filtered(g)
        if filtered:
            self._record_tags([t for g in filtered for t in g.trajectories])

    def _maybe_train(self) -> None:
        if self.learn is not None:
            return
        trainer = self.cfg.trainer
        groups = self.replay.take_batch()
        for gid in self.replay.drain_dropped():
            self.ledger.dropped(gid)
        self._drain_filtered()
        partial = False
        if groups is None and self.window.filtered_count >= trainer.fill_patience * trainer.groups_per_step:
            # The filter keeps emptying the batch (a policy that always or never succeeds here).
            if trainer.unfilled == "partial":
                groups = self.replay.take_batch(partial=True)
                partial = groups is not None
            if groups is None:
                log.warning("step %d skipped: %d groups in a row had equal rewards (trainer.unfilled=%s)",
                            self.step + 1, self.window.filtered_count, trainer.unfilled)
                self._skipped_row = self._skip_step()
                return
            log.warning("step %d runs on %d of %d groups: %d had equal rewards (trainer.unfilled=partial)",
                        self.step + 1, len(groups), trainer.groups_per_step, self.window.filtered_count)
        if groups is None:
            return
        trajs = [t for g in groups for t in g.trajectories]
        for g in groups:
            self.ledger.consumed(g.group_id)
        # Tags of what the learner trains on go to the coordinator first, then
        # its tag weights (an object ref: resolved by Ray, coordinator -> learner).
        self._record_tags(trajs)
        weights_ref = self.actors.coordinator.step_weights.remote()
        group_weights = {g.group_id: g.weight for g in groups if g.weight < 1.0}
        ref = self.actors.learners.train(trajs, weights_ref, group_weights, self.version, partial)
        self.learn = (ref, groups, time.perf_counter())
        lc = self.cfg.learner.cfg
        self.progress.learner_train(self.step + 1, learner_work(len(groups), len(trajs), lc.mini_batch_groups, lc.old_logprobs))

    def _skip_step(self) -> dict[str, Any]:
        """A step without a learner update: no new policy version, nothing published; the
        coordinator still closes the round (the failure profile grew by the filtered groups)."""
        import ray

        self.step += 1
        interface = ray.get(self.actors.coordinator.end_round.remote(wait=self.sync))
        return self.window.row(self, [], None, interface, 0.0)

    def _maybe_finish_step(self) -> dict[str, Any] | None:
        import ray

        if self._skipped_row is not None:
            row, self._skipped_row = self._skipped_row, None
            return row
        if self.learn is None:
            return None
        ref, groups, started = self.learn
        if not self.actors.learners.done(ref):
            return None
        result = self.actors.learners.result(ref)  # a learner failure ends the run (resume=RUN_DIR continues it)
        t_learn = time.perf_counter() - started
        self.learn = None
        self.version += 1
        self.step += 1
        self.replay.set_policy_version(self.version)
        self.progress.learner_phase(f"publish policy v{self.version} to the generator")
        fleet = self.actors.generators
        if fleet.canary_ids:  # the learner's view of the new weights, before they leave it
            fleet.expect(self.version, self.actors.learners.canary_logprobs(fleet.canary_ids))
        publish = self._publish()
        for ref in publish:
            self.publishing[ref] = self.version
        round_ref = self.actors.coordinator.end_round.remote(wait=self.sync)
        if self.sync:  # generation waits for the new weights and interface; async goes on
            for ref in publish:
                ray.wait([ref], timeout=self.actors.generators.update_timeout_s)
                if ref in self.publishing:
                    self._published(ref)
        interface = ray.get(round_ref)
        self.totals["update_tokens"] += result["sequence_tokens"]
        self.totals["rollout_tokens"] += sum(r.prompt_tokens + r.generated_tokens for r in self.window.reports)
        return self.window.row(self, groups, result, interface, t_learn)

    def _form_weight_group(self) -> None:
        """The learner (rank 0) and every worker of every replica form a broadcast group
        of their own (gloo on CPU, NCCL on GPU; 1 + replicas x TP ranks), as verl and OpenRLHF do."""
        import ray

        host, port = self.actors.learners.weight_group_address()
        backend = "nccl" if self.cfg.learner.cfg.device == "cuda" else "gloo"
        world, joins = self.actors.generators.join_weight_group(host, port, backend)
        meta = self.actors.learners.join_weight_group(host, port, world, backend, self.weight_dtype)
        self.weight_meta = ray.get(meta)
        ray.get(joins)

    def _publish(self) -> list:
        """New weights to every replica: by broadcast over the weight group, or through the
        object store (the learner's buckets, each read zero-copy and loaded before the next). A
        group missing a replica being restored cannot carry a round: that round goes through the
        object store."""
        fleet = self.actors.generators
        if self.broadcast and not fleet.restoring:
            refs = fleet.publish(self.version, metadata=self.weight_meta)
            self.actors.learners.broadcast_weights()  # its failure surfaces at the learner group's next call
            return refs
        if self.broadcast:
            log.warning("weight group incomplete (%s being restored): v%d goes through the object store",
                        ", ".join(sorted(fleet.restoring)), self.version)
        # Let the previous version's buckets go before the new ones are put (replicas still
        # loading them hold refs of their own): the store holds one version where it can.
        self.weights_manifest = None
        self.weights_manifest, self.weights_version = self.actors.learners.weights(self.weight_dtype), self.version
        return fleet.publish(self.version, self.weights_manifest)

    def _published(self, ref) -> None:
        self.publishing.pop(ref, None)
        seconds = self.actors.generators.published(ref)
        if seconds is not None:
            self.publish_s = seconds
        self.acked = max(self.acked, self.actors.generators.acked())

    # ------------------------------------------------------------ control
    def _on_control(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        if command == "scale":
            for key in ("env", "generators"):
                if key in args and (not isinstance(args[key], int) or args[key] < 1):
                    raise ValueError(f"scale needs {key}=N with N >= 1, got {args[key]!r}")
            if "env" in args:
                self.actors.scale_env(args["env"])
            if "generators" in args:
                self.actors.generators.scale(args["generators"], self._latest_weights)
                if self.broadcast:  # the group's membership changed: re-form it with the replicas serving now
                    self._form_weight_group()
            return {"env_actors": self.actors.target_env, "generators": len(self.actors.generators.handles)}
        if command == "status":
            return {"step": self.step, "policy_version": self.version, "env_actors": self.actors.target_env,
                    "generators": len(self.actors.generators.handles),
                    "in_flight": len(self.jobs), **self.ledger.counters.__dict__,
                    "unauthorized": {"replay": self.replay.counters()["unauthorized"], "control": self.control.unauthorized},
                    "replay_frames_by_peer": self.replay.counters()["frames_by_peer"]}
        raise ValueError(f"unknown control command {command!r} (scale, status)")

    # ------------------------------------------------------------ state
    def checkpoint(self) -> Path:
        import ray

        path = checkpoint_dir(self.storage)
        self.progress.learner_phase(f"checkpoint step {self.step} to {path}")
        totals = {**self.totals, "wall_s": self.totals["wall_s"] + time.perf_counter() - self.started}
        extra = {"coordinator": ray.get(self.actors.coordinator.state_dict.remote()), "step": self.step,
                 "policy_version": self.version, "slots": self.ledger.state(), "totals": totals}
        self.actors.learners.save_checkpoint(str(path), extra, keep=int(self.cfg.trainer.get("checkpoint_keep", 0)))
        return path

    def snapshot(self, initial: bool = False, metrics: dict[str, Any] | None = None) -> Path:
        """A frozen snapshot (seal/run/snapshots.py); A_0 references the base model."""
        import ray

        from weights.model_assets import load_tokenizer

        state = ray.get(self.actors.coordinator.state_dict.remote())
        name = next_name(self.run_dir)
        weights = str(self.cfg.model.path)
        if not initial:
            self.progress.learner_phase(f"snapshot {name} (step {self.step}, policy v{self.version})")
            out = snapshot_root(self.storage) / name
            path, _ = self.actors.learners.publish(str(out), self.version)
            load_tokenizer(str(self.cfg.model.path)).save_pretrained(path)  # vLLM loads the directory alone
            # Relative inside the run dir (it can move); absolute on a storage of its own.
            weights = str(Path(path).relative_to(self.run_dir)) if Path(path).is_relative_to(self.run_dir) else str(path)
        totals = {**self.totals, "wall_s": self.totals["wall_s"] + time.perf_counter() - self.started}
        record = {"name": name, "step": self.step, "policy_version": self.version, "interface_version": state["interface"]["version"],
                  "weights": weights, **totals}
        return write_snapshot(self.run_dir, record, state["interface"], state["capability"], metrics)

    def close(self) -> None:
        import ray

        for part in (self.control, self.replay, self.actors):
            if part is not None:
                part.close()
        if self._owns_ray:
            ray.shutdown()


def check_trainer_config(cfg) -> None:
    t = cfg.trainer
    if t.mode not in ("sync", "async"):
        raise ValueError(f"trainer.mode must be sync or async, got {t.mode!r}")
    if t.mode == "async" and t.max_staleness < 1:
        raise ValueError("trainer.mode=async needs trainer.max_staleness >= 1 (0 is sync mode)")
    if t.steps < 1 or t.groups_per_step < 1:
        raise ValueError("trainer.steps and trainer.groups_per_step must be >= 1")
    if t.filter_groups not in ("none", "zero_variance"):
        raise ValueError(f"trainer.filter_groups must be none or zero_variance, got {t.filter_groups!r}")
    if t.unfilled not in ("skip", "partial"):
        raise ValueError(f"trainer.unfilled must be skip or partial, got {t.unfilled!r}")
    if t.get("checkpoint_keep", 0) < 0:
        raise ValueError(f"trainer.checkpoint_keep must be >= 0 (0: keep all), got {t.checkpoint_keep}")
    world = cfg.learner.get("world_size", 1)
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"learner.world_size must be an integer >= 1, got {world!r}")
    if world > 1 and cfg.learner.cfg.backend != "deepspeed":
        raise ValueError(f"learner.world_size={world} needs a DeepSpeed learner (learner=zero2 or learner=zero3)")
    if t.get("canary_max_logprob_diff", 1.0) <= 0:
        raise ValueError(f"trainer.canary_max_logprob_diff must be > 0, got {t.canary_max_logprob_diff}")
    if t.fill_patience < 1 or t.oversample < 0:
        raise ValueError("trainer.fill_patience must be >= 1 (batches of filtered groups) and trainer.oversample >= 0")
    instantiate(cfg.guideline_policy)  # built in the coordinator actor: fail here, before anything starts
