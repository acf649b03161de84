"""One metrics row per learner step, from what happened since the last one.

Throughputs are pipeline figures over the window between two learner steps
(generated tokens per wall second, not per generator-busy second); waits are
summed per stage; idle ratios say how much of the window each stage had
nothing to do. Counters (dropped, reissued, rejected, ...) are cumulative.

Generation figures (groups, tokens, prefix-cache hits, env time) describe the groups
the step decided (trained, filtered, dropped as stale, re-issued for infra faults),
whenever their reports arrived: a group is attributed to one step, never to the one
its report happened to land in. Episodes the system ended (infra faults) are counted
by kind and never enter a reward figure; the wasted-token ledger (replay/token_ledger.py)
says where each generated token went.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.generation.replica_counters import ReplicaStats
from learner.step_result import LearnerStepResult, learner_row
from replay.control_messages import GroupReport, InterfaceStateMessage, RoundEnd
from replay.messages import INFRA_FAULT_KINDS, Trajectory
from replay.queue import Group
from replay.token_ledger import TokenLedger, run_totals
from replay.transport import ReplayCounters

if TYPE_CHECKING:
    from seal.runtime.generator_fleet import GeneratorFleet

log = logging.getLogger(__name__)

# How a group decided in a step ended: the token bucket its members go to.
FATES = ("trained", "filtered", "stale_dropped", "infra_failed")


@dataclass(frozen=True)
class StepOutcome:
    """A learner step as the learner side ends it."""

    groups: list  # the batch trained on (replay.queue.Group); empty for a step skipped for want of reward variance
    result: LearnerStepResult | None  # the learner's (its ranks' merged); None for a skipped step
    interface: RoundEnd  # the coordinator's end-of-round answer
    t_learn: float  # seconds the learner took


@dataclass(frozen=True)
class RunFacts:
    """What a row reads from the rest of the run when its step ends (the driver gathers them)."""

    step: int
    policy_version: int
    env_actors: int  # the target count
    filtered_total: int  # slots whose groups the filter set aside (the ledger's counter)
    reissued: int
    given_up: int  # slots given up after max_attempts failures for the system's reasons (the ledger's counter)
    replay: ReplayCounters  # the replay server's counters (dropped_stale, rejected, unauthorized, ...)
    control_unauthorized: int  # refused handshakes on the control socket
    weight_rounds_failed: int  # weight rounds a replica left, since the start
    publish_s: float | None  # the latest completed publish
    generator_restores: int
    replicas: Mapping[str, ReplicaStats]  # each answering replica's stats (GeneratorFleet.stats)
    # The tokens the replicas generated since the run started, restarted and retired replicas
    # included (GeneratorFleet.generated_tokens); None when a replica did not answer this reading.
    generated_tokens: int | None
    replica_count: int  # replicas the fleet holds: fewer answering leaves the fleet's busy time unknown
    fleet: Mapping[str, Any]  # replica_metrics(...)


@dataclass(frozen=True)
class StepRecord:
    """One step's metrics row and what the driver keeps beside it, never in it."""

    row: dict[str, Any]  # the line of metrics.jsonl (seal/run/run_log.py)
    interface: InterfaceStateMessage  # the training interface in force after the step (RoundEnd.state): rounds.jsonl
    rollout_tokens: int  # prompt + generated tokens of the step's rollouts (RunState's token totals)


class StepWindow:
    def __init__(
        self, mode: str, max_new_tokens: int, learner_world_size: int, generator_replicas: int, skipped_overlong: int
    ) -> None:
        self.mode, self.max_new_tokens, self.skipped_overlong = mode, max_new_tokens, skipped_overlong
        self.learner_world_size = learner_world_size
        self.devices = learner_world_size + generator_replicas
        self._reset(time.perf_counter())
        self._books()
        self._gen_busy0: float | None = None

    def _reset(self, now: float) -> None:
        self.started = now
        self.failures: Counter[str] = Counter()
        self.decided: dict[str, list] = {fate: [] for fate in FATES}  # replay.queue.Group by fate, this step

    def _books(self) -> None:
        """What lives across steps: reports by group, the token ledger, infra-fault kinds seen."""
        self.reports: dict[str, GroupReport] = {}  # by group id, until the step deciding the group takes it
        # Groups whose step's row is written: a report of one later than that (past the settle
        # timeout) describes nothing left to count; kept, the run's end would count it in flight.
        self._rowed: set[str] = set()
        self.tokens = TokenLedger()
        self.fault_kinds_seen: set[str] = set()
        self._lost_tokens0 = 0  # the replay queue's lost_tokens at the last row
        self._gen_count0 = 0  # the generator's count at the last row that had one

    @property
    def filtered(self) -> list:
        return self.decided["filtered"]

    @property
    def filtered_count(self) -> int:
        return len(self.decided["filtered"])

    def add_filtered(self, group: Group) -> None:
        self.decide("filtered", group)

    def decide(self, fate: str, group: Group) -> None:
        """A group's fate, in the step that decided it: its tokens to their bucket, its infra faults counted."""
        self.decided[fate].append(group)
        self.tokens.add_group(fate, group)
        for t in group.faulted:
            fault = t.infra_fault
            assert fault is not None  # a faulted member carries its fault (replay/queue.py)
            kind = fault.kind
            if kind not in self.fault_kinds_seen:
                self.fault_kinds_seen.add(kind)
                log.warning(
                    "infra fault %s, first of its kind in this run (task %s, group %s): %s; such episodes are "
                    "not scored (counted as infra_failures)",
                    kind,
                    t.task_id,
                    t.group_id,
                    fault.message,
                )

    def awaiting_reports(self) -> list[str]:
        """Groups decided this step whose report has not come back yet."""
        return [g.group_id for gs in self.decided.values() for g in gs if g.group_id not in self.reports]

    def add_report(self, report: GroupReport) -> None:
        if report.group_id not in self._rowed:
            self.reports[report.group_id] = report

    def note_failure(self, exc: BaseException) -> None:
        self.failures[type(exc).__name__] += 1

    def row(
        self, outcome: StepOutcome, facts: RunFacts, now: float, undecided: Mapping[str, int] | None = None
    ) -> StepRecord:
        """The step's row and what goes beside it; ``now``: when it ended (the next window starts there). ``undecided``: at the
        run's end, the replay queue's groups no fate reached (group id -> tokens): the row then also
        closes the run's token books (``tokens_run``)."""
        wall = max(now - self.started, 1e-9)
        groups = outcome.groups  # decided "trained" when the learner took them (seal/run/learner_steps.py)
        decided = [g for gs in self.decided.values() for g in gs]
        reports = [self.reports.pop(g.group_id) for g in decided if g.group_id in self.reports]
        self._rowed.update(g.group_id for g in decided)
        trained = [t for g in groups for t in g.members]
        filtered = [t for g in self.filtered for t in g.members]
        # Everything this step consumed: the batch and the groups the filter set aside.
        trajs = trained + filtered
        tags = Counter(tag for t in trajs for tag in t.tags)
        total_tags = sum(tags.values()) or 1
        by_cat: dict[str, list] = defaultdict(list)
        for t in trajs:
            by_cat[t.category].append(t)
        faults = Counter(t.infra_fault.kind for g in decided for t in g.faulted)
        replicas = facts.replicas
        busy = sum(r.busy_s for r in replicas.values()) if len(replicas) == facts.replica_count else None
        gen_idle = None
        if busy is not None and self._gen_busy0 is not None and busy >= self._gen_busy0:
            gen_idle = max(0.0, 1.0 - (busy - self._gen_busy0) / wall)
        self._gen_busy0 = busy
        actors = max(facts.env_actors, 1)
        prompt = sum(r.generation.prompt_tokens for r in reports)
        env_s = sum(r.env_s for r in reports)
        counters = facts.replay
        result = outcome.result
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
            **learner_row(result),
            **episode_stats(trajs, self.max_new_tokens),
            "tokens_per_s_per_device": result.sequence_tokens / (wall * self.devices) if result else 0.0,
            "devices": self.devices,
            "learner_world_size": self.learner_world_size,
            # weight rounds a replica left (learner/weight_broadcast.py: WeightGroupError on rank 0), since the start
            "weight_rounds_failed": facts.weight_rounds_failed,
            "tag_fractions": {k: v / total_tags for k, v in sorted(tags.items())},
            "interface_version": interface.interface_version,
            "active_guidelines": list(interface.active_guidelines),
            "gen_tokens_per_s": sum(r.generation.generated_tokens for r in reports) / wall,
            **facts.fleet,
            "prefix_cache_hit_rate": sum(r.generation.cached_prompt_tokens for r in reports) / prompt
            if prompt
            else 0.0,
            "env_steps_per_s": sum(r.env_steps for r in reports) / env_s if env_s else 0.0,
            "env_tool_calls": sum(r.tool_calls for r in reports),
            "groups_generated": len(decided),  # the groups this step decided, whatever their fate
            "publish_s": facts.publish_s,
            "wait_s": {
                "generate": sum(r.generation.generate_s for r in reports),
                # the replicas scoring the KL reference (trainer.reference_logprobs=generator); 0 otherwise
                "reference": sum(r.generation.reference_s for r in reports),
                "env": env_s,
                "send": sum(r.send_s for r in reports),
                "learner": outcome.t_learn,
            },
            "idle_ratio": {
                "env_actors": max(0.0, 1.0 - sum(r.wall_s for r in reports) / (actors * wall)),
                "generator": gen_idle,
                "learner": max(0.0, 1.0 - (result.seconds if result else 0.0) / wall),
            },
            "dropped": counters.queue.dropped_stale,
            "reissued": facts.reissued,
            "rejected": counters.server.rejected,
            # Refused CURVE handshakes on the replay stream and the control socket (replay/auth.py).
            "unauthorized": counters.server.unauthorized + facts.control_unauthorized,
            "abandoned": counters.queue.abandoned,
            "replay_frames_by_peer": counters.server.frames_by_peer,  # cumulative, by the IP each frame came from
            "duplicates": counters.queue.duplicates,
            # rollouts with a non-finite behaviour logprob, made generation_error faults (replay/queue.py)
            "nonfinite_refused": counters.queue.nonfinite_refused,
            "lost_groups": dict(self.failures),
            # Episodes the system ended (never scored), by kind; the groups re-issued for them; slots given up.
            "infra_failures": {k: faults[k] for k in INFRA_FAULT_KINDS},
            "infra_failures_total": sum(faults.values()),
            "episodes_played": sum(len(g.members) + len(g.faulted) for g in decided),
            "fault_reissued_groups": len(self.decided["infra_failed"]),
            "given_up": facts.given_up,
            **self._token_books(facts, undecided),
            **self._end_faults(undecided),
            "generator_restores": facts.generator_restores,
            "env_actors": facts.env_actors,
            "skipped_overlong_tasks": self.skipped_overlong,
            "step_s": wall,
        }
        self._reset(now)
        rollout_tokens = sum(r.generation.prompt_tokens + r.generation.generated_tokens for r in reports)
        return StepRecord(row, interface.state, rollout_tokens)

    def _end_faults(self, undecided: Mapping[str, int] | None) -> dict[str, Any]:
        """At the run's end (``undecided`` given): the infra faults and episodes of the groups that finished
        but no step decided (they came in after the last batch), from their reports; the closing note
        counts them with the rows' (seal/run/summary.py infra_text)."""
        if undecided is None:
            return {}
        ended = [self.reports[g] for g in sorted(set(undecided) | set(self.reports)) if g in self.reports]
        kinds = Counter(kind for r in ended for kind in r.faults if kind)
        return {
            "infra_failures_end": {k: kinds[k] for k in INFRA_FAULT_KINDS},
            "episodes_played_end": sum(len(r.faults) or r.sent for r in ended),
        }

    def _token_books(self, facts: RunFacts, undecided: Mapping[str, int] | None) -> dict[str, Any]:
        """``tokens``: this step's buckets and the generator's own count over the step; at the run's
        end also ``tokens_run``: the run's buckets against the generator's count since the start."""
        lost = facts.replay.queue.lost_tokens
        self.tokens.add("lost", max(0, lost - self._lost_tokens0))
        self._lost_tokens0 = lost
        # The generator's count only grows (restarts included), so the rows' counts add up to the
        # run's; a row without one (a replica did not answer) leaves its tokens to the next row's.
        count = facts.generated_tokens
        step_generated = None
        if count is not None:
            step_generated, self._gen_count0 = count - self._gen_count0, count
        out: dict[str, Any] = {}
        if undecided is not None:
            # Groups the end left open: a finished group by its report (whole), else what reached the queue.
            open_ids = set(undecided) | set(self.reports)
            self.tokens.add(
                "in_flight_end",
                sum(
                    self.reports[g].generation.generated_tokens if g in self.reports else undecided[g] for g in open_ids
                ),
            )
        out["tokens"] = {**self.tokens.close_step(), "generated": step_generated}
        if undecided is not None:
            out["tokens_run"] = self.tokens.totals(count)
        return out


def sum_token_books(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's token books over its invocations (a resumed run starts new ones): each invocation's
    last row carries ``tokens_run``; None when no row does."""
    books = [r["tokens_run"] for r in rows if r.get("tokens_run")]
    if not books:
        return None
    buckets: Counter[str] = Counter()
    for b in books:
        buckets.update({k: v for k, v in b.items() if k not in ("attributed", "generated", "unattributed")})
    counts = [b.get("generated") for b in books]
    return run_totals(buckets, None if None in counts else sum(counts))


def token_staleness(trajs: Sequence[Trajectory], learner_version: int) -> dict[str, Any]:
    """Per generated token: how many versions behind the weights it trained against it was made; and
    the episodes whose tokens came from more than one policy version (an update landed mid-episode;
    0 under trainer.episode_version=pinned)."""
    tokens = [(learner_version - s.policy_version, s.end - s.start) for t in trajs for s in t.segments]
    n = sum(k for _, k in tokens)
    return {
        "token_staleness_mean": sum(v * k for v, k in tokens) / n if n else None,
        "token_staleness_max": max((v for v, k in tokens if k), default=None),
        "mixed_version_episodes": sum(
            len({s.policy_version for s in t.segments if s.end > s.start}) > 1 for t in trajs
        ),
    }


def episode_stats(trajs: Sequence[Trajectory], max_new_tokens: int) -> dict[str, Any]:
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


def replica_metrics(fleet: GeneratorFleet, replicas: Mapping[str, ReplicaStats]) -> dict[str, Any]:
    """Per-replica counters since the replica started (requests, load, prefix hits) and the fleet's events."""
    c = fleet.counters
    failed, c.failed_replicas = list(c.failed_replicas), []
    canary, c.canary_max_diff = c.canary_max_diff, None
    return {
        "generator_replicas": len(fleet.router.replicas),
        "replica_requests": {n: r.requests for n, r in replicas.items()},
        "replica_outstanding_tokens": {n: r.outstanding_tokens for n, r in replicas.items()},
        "replica_queue_depth": {n: r.outstanding for n, r in replicas.items()},  # requests in the engine or waiting
        "replica_prefix_cache_hit_rate": {
            n: r.prefix_cache_hit_rate for n, r in replicas.items() if r.prefix_cache_hit_rate is not None
        },
        # Since each replica started (async replicas; actors/generation/async_vllm_engine.py): updates after which vLLM
        # kept the old prefix cache (requests after them never read it), pause drains cut short by their bound.
        "prefix_cache_reset_refused": sum(r.prefix_cache_reset_refused for r in replicas.values()),
        "drain_timeouts": sum(r.drain_timeouts for r in replicas.values()),
        "replica_groups_routed": {n: load.routed for n, load in fleet.router.load.items()},
        "weight_sync_timeouts": c.update_timeouts,
        "weight_sync_failed_replicas": failed,
        "weight_sync_max_logprob_diff": canary,  # None: no canary came back since the last row
        "weight_sync_canary_failures": c.canary_failures,
        "generator_restores_total": c.restores,
    }
