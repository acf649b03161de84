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
        self.filtered: list = []  # replay.queue.Group set aside for zero reward variance

    @property
    def filtered_count(self) -> int:
        return len(self.filtered)

    def add_filtered(self, group) -> None:
        self.filtered.append(group)

    def add_report(self, report: GroupReport) -> None:
        self.reports.append(report)

    def note_failure(self, exc: BaseException) -> None:
        self.failures[type(exc).__name__] += 1

    def row(self, pipeline, groups, result: Mapping[str, Any] | None, interface: Mapping[str, Any],
            t_learn: float) -> dict[str, Any]:
        """``result`` is the learner's, or None for a step skipped for want of reward variance."""
        now = time.perf_counter()
        wall = max(now - self.started, 1e-9)
        reports = self.reports
        trained = [t for g in groups for t in g.trajectories]
        filtered = [t for g in self.filtered for t in g.trajectories]
        # Everything this step consumed: the batch and the groups the filter set aside.
        trajs = trained + filtered
        tags = Counter(tag for t in trajs for tag in t.tags)
        total_tags = sum(tags.values()) or 1
        by_cat: dict[str, list] = defaultdict(list)
        for t in trajs:
            by_cat[t.category].append(t)
        fleet = pipeline.actors.generators
        replicas = fleet.stats()  # a replica that does not answer (restarting) is left out
        busy = sum(r["busy_s"] for r in replicas.values()) if len(replicas) == len(fleet.handles) else None
        gen_idle = None
        if busy is not None and self._gen_busy0 is not None and busy >= self._gen_busy0:
            gen_idle = max(0.0, 1.0 - (busy - self._gen_busy0) / wall)
        self._gen_busy0 = busy
        actors = max(pipeline.actors.target_env, 1)
        prompt = sum(r.prompt_tokens for r in reports)
        env_s = sum(r.env_s for r in reports)
        counters = pipeline.replay.counters()
        result = result or {}
        cfg = pipeline.cfg
        devices = int(cfg.learner.get("world_size", 1)) + int(cfg.generator.get("replicas", 1))
        row = {
            "step": pipeline.step,
            "mode": "sync" if pipeline.sync else "async",
            "policy_version": pipeline.version,
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            "success_by_category": {c: sum(t.success for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "reward_by_category": {c: sum(t.reward for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "rollouts_by_category": {c: len(ts) for c, ts in sorted(by_cat.items())},  # weights for pooling steps (seal/run/summary.py)
            "skipped": not groups,
            "trained_groups": len(groups),
            "trained_reward_mean": sum(t.reward for t in trained) / len(trained) if trained else None,
            "filtered_groups": len(self.filtered),
            "filtered_by_category": dict(sorted(Counter(g.trajectories[0].category for g in self.filtered).items())),
            "filtered_total": pipeline.ledger.counters.filtered,  # drained ones: the rows' filtered_groups add up to it
            "staleness_mean": sum(g.staleness for g in groups) / len(groups) if groups else None,
            "staleness_max": max(g.staleness for g in groups) if groups else None,
            **token_staleness(trained, pipeline.version - (1 if groups else 0)),
            "mean_scale": result.get("mean_scale"),
            "zero_variance_groups": result.get("zero_variance_groups"),
            "loss": result.get("loss"),
            "kl": result.get("kl"),
            "grad_norm": result.get("grad_norm"),
            **{k: result.get(k) for k in LEARNER_KEYS},
            **episode_stats(trajs, int(cfg.sampling.max_new_tokens)),
            "tokens_per_s_per_device": result["sequence_tokens"] / (wall * devices) if result else 0.0,
            "devices": devices,
            "learner_world_size": int(cfg.learner.get("world_size", 1)),
            # weight rounds a replica left (learner/weight_broadcast.py: WeightGroupError on rank 0), since the start
            "weight_rounds_failed": len(pipeline.actors.learners.survivable_failures),
            "tag_weights": result.get("tag_weights"),
            "tag_fractions": {k: v / total_tags for k, v in sorted(tags.items())},
            "interface_version": interface["interface_version"],
            "active_guidelines": interface["active_guidelines"],
            "gen_tokens_per_s": sum(r.generated_tokens for r in reports) / wall,
            **replica_metrics(fleet, replicas),
            "prefix_cache_hit_rate": sum(r.cached_prompt_tokens for r in reports) / prompt if prompt else 0.0,
            "env_steps_per_s": sum(r.env_steps for r in reports) / env_s if env_s else 0.0,
            "env_tool_calls": sum(r.tool_calls for r in reports),
            "groups_generated": len(reports),
            "learner_samples_per_s": result.get("samples_per_s"),
            "learner_tokens_per_s": result.get("tokens_per_s"),
            "publish_s": pipeline.publish_s,
            "wait_s": {"generate": sum(r.generate_s for r in reports), "env": env_s,
                       "send": sum(r.send_s for r in reports), "learner": t_learn},
            "idle_ratio": {"env_actors": max(0.0, 1.0 - sum(r.wall_s for r in reports) / (actors * wall)),
                           "generator": gen_idle, "learner": max(0.0, 1.0 - result.get("seconds", 0.0) / wall)},
            "dropped": counters["dropped_stale"],
            "reissued": pipeline.ledger.counters.reissued,
            "rejected": counters["rejected"],
            # Refused CURVE handshakes on the replay stream and the control socket (replay/auth.py).
            "unauthorized": counters["unauthorized"] + (pipeline.control.unauthorized if pipeline.control else 0),
            "abandoned": counters["abandoned"],
            "replay_frames_by_peer": counters["frames_by_peer"],  # cumulative, by the IP each frame came from
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


# The learner's off-policy and loss statistics copied into the row (learner/step_stats.py).
LEARNER_KEYS = ("pg_loss", "entropy", "clip_frac", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean",
                "mismatch_kl", "mismatch_kl_max", "mismatch_abs_logprob_diff", "mismatch_tokens", "offpolicy_kl",
                "is_weight_mean", "is_weight_max", "is_truncated_frac", "ess", "mini_batches")


def token_staleness(trajs, learner_version: int) -> dict[str, Any]:
    """Per generated token: how many versions behind the weights it trained against it was made."""
    tokens = [(learner_version - s.policy_version, s.end - s.start) for t in trajs for s in t.segments]
    n = sum(k for _, k in tokens)
    return {"token_staleness_mean": sum(v * k for v, k in tokens) / n if n else None,
            "token_staleness_max": max((v for v, k in tokens if k), default=None)}


def episode_stats(trajs, max_new_tokens: int) -> dict[str, Any]:
    """Response length (generated tokens per episode; a step's output truncated when it hit
    max_new_tokens), tool calls and parse failures per episode."""
    if not trajs:
        return {"response_len_mean": None, "response_len_max": None, "response_truncated_frac": None,
                "tool_calls_per_episode": None, "parse_failures_per_episode": None}
    lengths = [t.num_generated_tokens for t in trajs]
    segments = [s.end - s.start for t in trajs for s in t.segments]
    return {"response_len_mean": sum(lengths) / len(lengths), "response_len_max": max(lengths),
            "response_truncated_frac": sum(k >= max_new_tokens for k in segments) / len(segments) if segments else 0.0,
            "tool_calls_per_episode": sum(t.num_tool_calls for t in trajs) / len(trajs),
            "parse_failures_per_episode": sum(t.num_parse_errors for t in trajs) / len(trajs)}


def replica_metrics(fleet, replicas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per-replica counters since the replica started (requests, load, prefix hits) and the fleet's events."""
    c = fleet.counters
    failed, c.failed_replicas = list(c.failed_replicas), []
    canary, c.canary_max_diff = c.canary_max_diff, None
    return {
        "generator_replicas": len(fleet.router.replicas),
        "replica_requests": {n: r.get("requests", 0) for n, r in replicas.items()},
        "replica_outstanding_tokens": {n: r.get("outstanding_tokens", 0) for n, r in replicas.items()},
        "replica_queue_depth": {n: r.get("outstanding", 0) for n, r in replicas.items()},  # requests in the engine or waiting
        "replica_prefix_cache_hit_rate": {n: r["prefix_cache_hit_rate"] for n, r in replicas.items() if "prefix_cache_hit_rate" in r},
        # Since each replica started (async replicas; actors/generation/async_vllm_engine.py): updates after which vLLM
        # kept the old prefix cache (requests after them never read it), pause drains cut short by their bound.
        "prefix_cache_reset_refused": sum(r.get("prefix_cache_reset_refused", 0) for r in replicas.values()),
        "drain_timeouts": sum(r.get("drain_timeouts", 0) for r in replicas.values()),
        "replica_groups_routed": {n: load.routed for n, load in fleet.router.load.items()},
        "weight_sync_timeouts": c.update_timeouts,
        "weight_sync_failed_replicas": failed,
        "weight_sync_max_logprob_diff": canary,  # None: no canary came back since the last row
        "weight_sync_canary_failures": c.canary_failures,
        "generator_restores_total": c.restores,
    }
