"""One metrics row per learner step, from what happened since the last one.

Throughputs are pipeline figures over the window between two learner steps
(generated tokens per wall second, not per generator-busy second); waits are
summed per stage; idle ratios say how much of the window each stage had
nothing to do. Counters (dropped, reissued, rejected, ...) are cumulative.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any, Mapping

from replay.messages import GroupReport


class StepWindow:
    def __init__(self) -> None:
        self.generator_restores = 0
        self._reset(time.perf_counter())
        self._gen_busy0: float | None = None

    def _reset(self, now: float) -> None:
        self.started = now
        self.reports: list[GroupReport] = []
        self.failures: Counter[str] = Counter()

    def add_report(self, report: GroupReport) -> None:
        self.reports.append(report)

    def note_failure(self, exc: BaseException) -> None:
        self.failures[type(exc).__name__] += 1

    def row(self, pipeline, groups, result: Mapping[str, Any], interface: Mapping[str, Any], t_learn: float) -> dict[str, Any]:
        import ray

        now = time.perf_counter()
        wall = max(now - self.started, 1e-9)
        reports = self.reports
        trajs = [t for g in groups for t in g.trajectories]
        tags = Counter(tag for t in trajs for tag in t.tags)
        total_tags = sum(tags.values()) or 1
        by_cat: dict[str, list] = defaultdict(list)
        for t in trajs:
            by_cat[t.category].append(t)
        try:
            busy = ray.get(pipeline.actors.generator.stats.remote())["busy_s"]
        except ray.exceptions.RayActorError:  # restarting: its counters start over
            busy = None
        gen_idle = None
        if busy is not None and self._gen_busy0 is not None and busy >= self._gen_busy0:
            gen_idle = max(0.0, 1.0 - (busy - self._gen_busy0) / wall)
        self._gen_busy0 = busy
        actors = max(pipeline.actors.target_env, 1)
        prompt = sum(r.prompt_tokens for r in reports)
        env_s = sum(r.env_s for r in reports)
        counters = pipeline.replay.counters()
        row = {
            "step": pipeline.step,
            "mode": "sync" if pipeline.sync else "async",
            "policy_version": pipeline.version,
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            "success_by_category": {c: sum(t.success for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "reward_by_category": {c: sum(t.reward for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "staleness_mean": sum(g.staleness for g in groups) / len(groups),
            "staleness_max": max(g.staleness for g in groups),
            "mean_scale": result["mean_scale"],
            "zero_variance_groups": result["zero_variance_groups"],
            "loss": result.get("loss"),
            "kl": result.get("kl"),
            "grad_norm": result.get("grad_norm"),
            "tag_weights": result["tag_weights"],
            "tag_fractions": {k: v / total_tags for k, v in sorted(tags.items())},
            "interface_version": interface["interface_version"],
            "active_guidelines": interface["active_guidelines"],
            "gen_tokens_per_s": sum(r.generated_tokens for r in reports) / wall,
            "prefix_cache_hit_rate": sum(r.cached_prompt_tokens for r in reports) / prompt if prompt else 0.0,
            "env_steps_per_s": sum(r.env_steps for r in reports) / env_s if env_s else 0.0,
            "env_tool_calls": sum(r.tool_calls for r in reports),
            "groups_generated": len(reports),
            "learner_samples_per_s": result["samples_per_s"],
            "learner_tokens_per_s": result["tokens_per_s"],
            "publish_s": pipeline.publish_s,
            "wait_s": {"generate": sum(r.generate_s for r in reports), "env": env_s,
                       "send": sum(r.send_s for r in reports), "learner": t_learn},
            "idle_ratio": {"env_actors": max(0.0, 1.0 - sum(r.wall_s for r in reports) / (actors * wall)),
                           "generator": gen_idle, "learner": max(0.0, 1.0 - result["seconds"] / wall)},
            "dropped": counters["dropped_stale"],
            "reissued": pipeline.ledger.counters.reissued,
            "rejected": counters["rejected"],
            "abandoned": counters["abandoned"],
            "duplicates": counters["duplicates"],
            "lost_groups": dict(self.failures),
            "generator_restores": self.generator_restores,
            "env_actors": pipeline.actors.target_env,
            "skipped_overlong_tasks": pipeline.skipped_overlong,
            "step_s": wall,
            "_interface": interface["state"],
        }
        self._reset(now)
        return row
