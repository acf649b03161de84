"""The synchronous trainer: generation and learning alternate (staleness 0).

Wires the components in one process: env objects, the vLLM generator, the
replay queue, the coordinator and the learner. Each step: rollouts of
``groups_per_step`` tasks (training interface), tag summaries to the
coordinator, a batch from the replay queue, one EMA step of the tag weights,
the learner update, the new weights into the generator in place, one
interface evolution. Writes metrics.jsonl (one object per learner step),
TensorBoard scalars, per-round failure profiles and interface states, and
checkpoints that `resume=RUN_DIR` continues from.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from actors.chat import ChatTokenizer
from actors.coordinator import Coordinator
from actors.rollout import GroupStats, run_group
from replay.messages import TagSummary
from replay.queue import ReplayQueue


class SyncTrainer:
    def __init__(self, cfg, instantiate, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.make_env = lambda: instantiate(cfg.env)  # noqa: E731 - one env object per concurrent episode
        self.task_ids = self.make_env().task_ids(cfg.split)
        if cfg.limit is not None:
            self.task_ids = self.task_ids[: int(cfg.limit)]
        if not self.task_ids:
            raise ValueError("no tasks to train on (check split and limit)")
        self.sampling = instantiate(cfg.sampling)
        t = cfg.trainer
        self.coordinator = Coordinator(instantiate(cfg.interface), instantiate(cfg.tag_weights), closed_loop=t.closed_loop,
                                       per_category_guidelines=t.per_category_guidelines,
                                       vocabulary=cfg.learner.cfg.apatch.vocabulary)
        self.queue = ReplayQueue(cfg.n, t.groups_per_step, max_staleness=t.max_staleness)
        self.generator = instantiate(cfg.generator)
        self.chat = ChatTokenizer(self.generator.tokenizer)
        self.skipped_overlong = 0
        if t.skip_overlong:
            self._drop_overlong_tasks()
        self.learner = instantiate(cfg.learner)
        self.step = 0
        self.cursor = 0  # next task index; an epoch ends when it wraps

    def _drop_overlong_tasks(self) -> None:
        """Tasks whose opening prompt leaves no room to answer would only
        produce context_overflow groups (zero reward, zero gradient)."""
        room = self.generator.max_model_len - self.sampling.max_new_tokens
        env, interface = self.make_env(), self.coordinator.interface
        keep = [t for t in self.task_ids if len(self.chat.prompt_ids(env.reset(t, interface))) <= room]
        self.skipped_overlong = len(self.task_ids) - len(keep)
        if not keep:
            raise ValueError(f"no task's opening prompt fits {room} tokens (model context {self.generator.max_model_len} minus max_new_tokens)")
        self.task_ids = keep

    # ---------------------------------------------------------------- state
    def checkpoint(self) -> Path:
        path = self.run_dir / "checkpoints" / "latest"
        self.learner.save_checkpoint(path, extra={"coordinator": self.coordinator.state_dict(), "step": self.step,
                                                 "cursor": self.cursor, "policy_version": self.generator.policy_version})
        return path

    def resume(self, run_dir: Path) -> None:
        extra = self.learner.load_checkpoint(run_dir / "checkpoints" / "latest")
        self.coordinator.load_state_dict(extra["coordinator"])
        self.step, self.cursor = int(extra["step"]), int(extra["cursor"])
        version = int(extra["policy_version"])
        self.generator.update_weights(version, self.learner.full_state_dict())
        self.queue.set_policy_version(version)

    # ----------------------------------------------------------------- loop
    def _next_tasks(self, k: int) -> list[str]:
        out = []
        for _ in range(k):
            if self.cursor and self.cursor % len(self.task_ids) == 0:
                self.coordinator.end_epoch()
            out.append(self.task_ids[self.cursor % len(self.task_ids)])
            self.cursor += 1
        return out

    def run(self, steps: int, progress=None) -> list[dict[str, Any]]:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        history = []
        with open(self.run_dir / "metrics.jsonl", "a") as metrics_file, open(self.run_dir / "rounds.jsonl", "a") as rounds_file:
            for _ in range(steps):
                row = self.train_step()
                history.append(row)
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
                rounds_file.write(json.dumps({"step": row["step"], "failure_profile": row["tag_fractions"],
                                              "interface": self.coordinator.interface.to_dict()}) + "\n")
                self._tensorboard(writer, row)
                if self.cfg.trainer.checkpoint_every and row["step"] % self.cfg.trainer.checkpoint_every == 0:
                    self.checkpoint()
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(reward=f"{row['reward_mean']:.2f}", v=row["policy_version"])
        writer.close()
        return history

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        interface = self.coordinator.interface
        stats = GroupStats()
        for i, task_id in enumerate(self._next_tasks(self.cfg.trainer.groups_per_step)):
            group = run_group(self.make_env, self.generator, self.chat, task_id, self.cfg.n, self.sampling, interface,
                              group_id=f"s{self.step:06d}g{i:03d}", seed=self.cfg.seed + self.step * 1000 + i, stats=stats)
            for traj in group:
                self.queue.add(traj)
                self.coordinator.record(TagSummary(traj.task_id, traj.category, traj.tags, traj.labels, traj.reward,
                                                   traj.success, traj.progress, traj.interface_version))
        t_rollout = time.perf_counter() - t0
        groups = self.queue.take_batch()
        if groups is None:
            raise RuntimeError("the replay queue produced no batch in sync mode (all groups stale?)")
        trajs = [t for g in groups for t in g.trajectories]
        weights = self.coordinator.step_weights()
        t1 = time.perf_counter()
        learn = self.learner.train_batch(trajs, weights)
        t_learn = time.perf_counter() - t1
        t2 = time.perf_counter()
        version = self.generator.policy_version + 1
        self.generator.update_weights(version, self.learner.full_state_dict())
        self.queue.set_policy_version(version)
        t_publish = time.perf_counter() - t2
        new_interface = self.coordinator.end_round()
        self.step += 1
        tags = Counter(tag for t in trajs for tag in t.tags)
        total = sum(tags.values()) or 1
        categories = Counter(t.category for t in trajs)
        return {
            "step": self.step,
            "policy_version": version,
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            "success_by_category": {c: sum(t.success for t in trajs if t.category == c) / n for c, n in categories.items()},
            "staleness_mean": sum(g.staleness for g in groups) / len(groups),
            "staleness_max": max(g.staleness for g in groups),
            "mean_scale": learn["mean_scale"],
            "zero_variance_groups": learn["zero_variance_groups"],
            "loss": learn.get("loss"),
            "kl": learn.get("kl"),
            "tag_weights": weights,
            "tag_fractions": {k: v / total for k, v in sorted(tags.items())},
            "interface_version": new_interface.version,
            "active_guidelines": list(new_interface.active_guidelines),
            "gen_tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
            "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
            "env_steps_per_s": sum(t.num_steps for t in trajs) / max(sum(t.timings.get("env_s", 0.0) for t in trajs), 1e-9),
            "learner_samples_per_s": learn["samples_per_s"],
            "publish_s": t_publish,
            "wait_s": {"rollout": t_rollout, "learner": t_learn, "publish": t_publish},
            "dropped": self.queue.stats.dropped_stale,
            "reissued": self.queue.stats.reissued,
            "rejected": 0,  # frames refused by the wire decoder (async pipeline); none in process
            "skipped_overlong_tasks": self.skipped_overlong,
            "step_s": time.perf_counter() - t0,
        }

    @staticmethod
    def _tensorboard(writer, row: dict[str, Any]) -> None:
        step = row["step"]
        for key in ("reward_mean", "staleness_mean", "staleness_max", "mean_scale", "interface_version", "gen_tokens_per_s",
                    "env_steps_per_s", "learner_samples_per_s", "publish_s", "dropped", "reissued", "rejected", "loss", "kl"):
            if row.get(key) is not None:
                writer.add_scalar(f"train/{key}", row[key], step)
        for group in ("tag_weights", "tag_fractions", "success_by_category", "wait_s"):
            for k, v in row[group].items():
                writer.add_scalar(f"{group}/{k}", v, step)
        writer.add_text("interface/active_guidelines", ", ".join(row["active_guidelines"]) or "none", step)
