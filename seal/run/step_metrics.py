"""One metrics row per learner step, from what happened since the last one.

Throughputs are pipeline figures over the window between two learner steps
(generated tokens per wall second, not per generator-busy second); waits are
summed per stage; idle ratios say how much of the window each stage had
nothing to do. Counters (dropped, reissued, rejected, ...) are cumulative.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay.messages import GroupReport


@dataclass(frozen=True)
class StepOutcome:
    """A learner step as the learner side ends it."""

    groups: list  # the batch trained on (replay.queue.Group); empty for a step skipped for want of reward variance
    result: Mapping[str, Any] | None  # the learner's; None for a skipped step
    interface: Mapping[str, Any]  # the coordinator's end-of-round answer
    t_learn: float  # seconds the learner took


@dataclass(frozen=True)
class RunFacts:
    """What a row reads from the rest of the run when its step ends (the driver gathers them)."""

    step: int
    policy_version: int
    env_actors: int  # the target count
    filtered_total: int  # slots whose groups the filter set aside (the ledger's counter)
    reissued: int
    replay: Mapping[str, Any]  # the replay server's counters (dropped_stale, rejected, unauthorized, ...)
    control_unauthorized: int  # refused handshakes on the control socket
    weight_rounds_failed: int  # weight rounds a replica left, since the start
    publish_s: float | None  # the latest completed publish
    generator_restores: int
    replicas: Mapping[str, Mapping[str, Any]]  # each answering replica's stats (GeneratorFleet.stats)
    replica_count: int  # replicas the fleet holds: fewer answering leaves the fleet's busy time unknown
    fleet: Mapping[str, Any]  # replica_metrics(...)


class StepWindow:
    def __init__(
        self, mode: str, max_new_tokens: int, learner_world_size: int, generator_replicas: int, skipped_overlong: int
    ) -> None:
        self.mode, self.max_new_tokens, self.skipped_overlong = mode, max_new_tokens, skipped_overlong
        self.learner_world_size = learner_world_size
        self.devices = learner_world_size + generator_replicas
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

    def row(self, outcome: StepOutcome, facts: RunFacts, now: float) -> dict[str, Any]:
        """The step's row; ``now``: when it ended (the next window starts there)."""
        wall = max(now - self.started, 1e-9)
        reports, groups = self.reports, outcome.groups
        trained = [t for g in groups for t in g.trajectories]
        filtered = [t for g in self.filtered for t in g.trajectories]
        # Everything this step consumed: the batch and the groups the filter set aside.
        trajs = trained + filtered
        tags = Counter(tag for t in trajs for tag in t.tags)
        total_tags = sum(tags.values()) or 1
        by_cat: dict[str, list] = defaultdict(list)
        for t in trajs:
            by_cat[t.category].append(t)
        replicas = facts.replicas
        busy = sum(r["busy_s"] for r in replicas.values()) if len(replicas) == facts.replica_count else None
        gen_idle = None
        if busy is not None and self._gen_busy0 is not None and busy >= self._gen_busy0:
            gen_idle = max(0.0, 1.0 - (busy - self._gen_busy0) / wall)
        self._gen_busy0 = busy
        actors = max(facts.env_actors, 1)
        prompt = sum(r.prompt_tokens for r in reports)
        env_s = sum(r.env_s for r in reports)
        counters = facts.replay
        result = outcome.result or {}
        interface = outcome.interface
        row = {
            "step": facts.step,
            "mode": self.mode,
            "policy_version": facts.policy_version,
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            "success_by_category": {c: sum(t.success for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "reward_by_category": {c: sum(t.reward for t in ts) / len(ts) for c, ts in sorted(by_cat.items())},
            "rollouts_by_category": {
                c: len(ts) for c, ts in sorted(by_cat.items())
            },  # weights for pooling steps (seal/run/summary.py)
            "skipped": not groups,
            "trained_groups": len(groups),
            "trained_reward_mean": sum(t.reward for t in trained) / len(trained) if trained else None,
            "filtered_groups": len(self.filtered),
            "filtered_by_category": dict(sorted(Counter(g.trajectories[0].category for g in self.filtered).items())),
            "filtered_total": facts.filtered_total,  # drained ones: the rows' filtered_groups add up to it
            "staleness_mean": sum(g.staleness for g in groups) / len(groups) if groups else None,
            "staleness_max": max(g.staleness for g in groups) if groups else None,
            **token_staleness(trained, facts.policy_version - (1 if groups else 0)),
            "mean_scale": result.get("mean_scale"),
            "zero_variance_groups": result.get("zero_variance_groups"),
            "loss": result.get("loss"),
            "kl": result.get("kl"),
            "grad_norm": result.get("grad_norm"),
            **{k: result.get(k) for k in LEARNER_KEYS},
            **episode_stats(trajs, self.max_new_tokens),
            "tokens_per_s_per_device": result["sequence_tokens"] / (wall * self.devices) if result else 0.0,
            "devices": self.devices,
            "learner_world_size": self.learner_world_size,
            # weight rounds a replica left (learner/weight_broadcast.py: WeightGroupError on rank 0), since the start
            "weight_rounds_failed": facts.weight_rounds_failed,
            "tag_weights": result.get("tag_weights"),
            "tag_fractions": {k: v / total_tags for k, v in sorted(tags.items())},
            "interface_version": interface["interface_version"],
            "active_guidelines": interface["active_guidelines"],
            "gen_tokens_per_s": sum(r.generated_tokens for r in reports) / wall,
            **facts.fleet,
            "prefix_cache_hit_rate": sum(r.cached_prompt_tokens for r in reports) / prompt if prompt else 0.0,
            "env_steps_per_s": sum(r.env_steps for r in reports) / env_s if env_s else 0.0,
            "env_tool_calls": sum(r.tool_calls for r in reports),
            "groups_generated": len(reports),
            "learner_samples_per_s": result.get("samples_per_s"),
            "learner_tokens_per_s": result.get("tokens_per_s"),
            "publish_s": facts.publish_s,
            "wait_s": {
                "generate": sum(r.generate_s for r in reports),
                "env": env_s,
                "send": sum(r.send_s for r in reports),
                "learner": outcome.t_learn,
            },
            "idle_ratio": {
                "env_actors": max(0.0, 1.0 - sum(r.wall_s for r in reports) / (actors * wall)),
                "generator": gen_idle,
                "learner": max(0.0, 1.0 - result.get("seconds", 0.0) / wall),
            },
            "dropped": counters["dropped_stale"],
            "reissued": facts.reissued,
            "rejected": counters["rejected"],
            # Refused CURVE handshakes on the replay stream and the control socket (replay/auth.py).
            "unauthorized": counters["unauthorized"] + facts.control_unauthorized,
            "abandoned": counters["abandoned"],
            "replay_frames_by_peer": counters["frames_by_peer"],  # cumulative, by the IP each frame came from
            "duplicates": counters["duplicates"],
            "lost_groups": dict(self.failures),
            "generator_restores": facts.generator_restores,
            "env_actors": facts.env_actors,
            "skipped_overlong_tasks": self.skipped_overlong,
            "step_s": wall,
            "_interface": interface["state"],
        }
        self._reset(now)
        return row


# The learner's off-policy and loss statistics copied into the row (learner/step_stats.py).
LEARNER_KEYS = (
    "pg_loss",
    "entropy",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "ratio_mean",
    "mismatch_kl",
    "mismatch_kl_max",
    "mismatch_abs_logprob_diff",
    "mismatch_tokens",
    "offpolicy_kl",
    "is_weight_mean",
    "is_weight_max",
    "is_truncated_frac",
    "ess",
    "mini_batches",
)


def token_staleness(trajs, learner_version: int) -> dict[str, Any]:
    """Per generated token: how many versions behind the weights it trained against it was made."""
    tokens = [(learner_version - s.policy_version, s.end - s.start) for t in trajs for s in t.segments]
    n = sum(k for _, k in tokens)
    return {
        "token_staleness_mean": sum(v * k for v, k in tokens) / n if n else None,
        "token_staleness_max": max((v for v, k in tokens if k), default=None),
    }


def episode_stats(trajs, max_new_tokens: int) -> dict[str, Any]:
    """Response length (generated tokens per episode; a step's output truncated when it hit
    max_new_tokens), tool calls and parse failures per episode."""
    if not trajs:
        return {
            "response_len_mean": None,
            "response_len_max": None,
            "response_truncated_frac": None,
            "tool_calls_per_episode": None,
            "parse_failures_per_episode": None,
        }
    lengths = [t.num_generated_tokens for t in trajs]
    segments = [s.end - s.start for t in trajs for s in t.segments]
    return {
        "response_len_mean": sum(lengths) / len(lengths),
        "response_len_max": max(lengths),
        "response_truncated_frac": sum(k >= max_new_tokens for k in segments) / len(segments) if segments else 0.0,
        "tool_calls_per_episode": sum(t.num_tool_calls for t in trajs) / len(trajs),
        "parse_failures_per_episode": sum(t.num_parse_errors for t in trajs) / len(trajs),
    }


def replica_metrics(fleet, replicas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per-replica counters since the replica started (requests, load, prefix hits) and the fleet's events."""
    c = fleet.counters
    failed, c.failed_replicas = list(c.failed_replicas), []
    canary, c.canary_max_diff = c.canary_max_diff, None
    return {
        "generator_replicas": len(fleet.router.replicas),
        "replica_requests": {n: r.get("requests", 0) for n, r in replicas.items()},
        "replica_outstanding_tokens": {n: r.get("outstanding_tokens", 0) for n, r in replicas.items()},
        "replica_queue_depth": {
            n: r.get("outstanding", 0) for n, r in replicas.items()
        },  # requests in the engine or waiting
        "replica_prefix_cache_hit_rate": {
            n: r["prefix_cache_hit_rate"] for n, r in replicas.items() if "prefix_cache_hit_rate" in r
        },
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
