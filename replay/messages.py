"""What crosses the generator -> replay queue boundary.

One typed record per rollout (docs/design.md, the trajectory record). Producers: rollout workers
(rollout/play.py). Consumers: the replay queue and the learner. JSONL and
(with the async pipeline) msgpack both come from ``to_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# 2: ``infra_fault`` (typed) replaces the free-text ``error``; ``padding`` marks a group's stand-ins.
SCHEMA_VERSION = 2

# Why an episode ended because of the system, not the policy (docs/main-job.md, "Infra faults"):
# the generator failed a request, the engine refused one, the episode ran past
# trainer.episode_deadline_s, the environment's own code raised (a tool's error reply to the
# model is benchmark feedback, never one of these), or the model's chat template could not
# build a turn of the conversation (rollout/chat.py ChatBuildError, naming the model).
INFRA_FAULT_KINDS = ("generation_error", "engine_rejected", "deadline", "env_error", "chat_template")


@dataclass(frozen=True)
class InfraFault:
    """An episode ended by the system: it never contributes a reward, an advantage or a group statistic."""

    kind: str  # one of INFRA_FAULT_KINDS
    message: str  # the first error, one line

    def __post_init__(self) -> None:
        if self.kind not in INFRA_FAULT_KINDS:
            raise ValueError(f"infra fault kind {self.kind!r}, expected one of {', '.join(INFRA_FAULT_KINDS)}")

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class Segment:
    """Generated tokens [start, end) and the policy version that sampled them: a trajectory's segment, and
    (offsets within the one output) a generator output's span (rollout/generator.py)."""

    start: int
    end: int
    policy_version: int


@dataclass
class Trajectory:
    task_id: str
    category: str
    env: str
    group_id: str
    rollout_index: int
    interface_version: int
    token_ids: list[int]
    loss_mask: list[int]  # 1 on model-generated tokens only
    logprobs: list[float]  # behaviour logprobs, 0.0 where loss_mask is 0
    prompt_length: int  # tokens of the opening prompt
    segments: list[Segment]
    reward: float
    success: bool
    progress: float
    tags: list[str]  # released vocabulary, one per user turn
    labels: list[str]  # paper vocabulary, one per user turn
    error_type: str | None
    outcome: str  # completed | step_limit | context_overflow | aborted
    num_tool_calls: int
    num_steps: int
    timings: dict[str, float] = field(default_factory=dict)  # generate_s, env_s, judge_s, total_s
    # Set when the system ended the episode (the episode still ends with a record): its reward is
    # not the policy's, so the replay queue keeps it out of every group statistic (replay/queue.py).
    infra_fault: InfraFault | None = None
    start_version: int = 0  # the generator's policy version when the episode began
    num_parse_errors: int = 0  # assistant steps whose tool calls did not parse
    # A stand-in the replay queue puts in an infra-failed member's place when the group trains on
    # the rest: the prompt alone, nothing generated, outside the group's statistics (learner/batch.py).
    padding: bool = False
    schema_version: int = SCHEMA_VERSION

    @property
    def error(self) -> str | None:
        """The infra fault as one line (``kind: message``), or None."""
        return None if self.infra_fault is None else str(self.infra_fault)

    @property
    def policy_version(self) -> int:
        """The oldest version that produced any token (staleness is measured from
        it); an episode that generated nothing (e.g. its prompt did not fit)
        counts from the version it started under."""
        return min((s.policy_version for s in self.segments), default=self.start_version)

    @property
    def policy_versions(self) -> list[int]:
        return [s.policy_version for s in self.segments]

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def validate(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"{self.task_id}: token_ids, loss_mask and logprobs differ in length ({n}, {len(self.loss_mask)}, {len(self.logprobs)})"
            )
        covered = [0] * n
        for s in self.segments:
            if not 0 <= s.start <= s.end <= n:
                raise ValueError(f"{self.task_id}: segment {s} outside the {n} tokens")
            for i in range(s.start, s.end):
                covered[i] = 1
        if covered != list(self.loss_mask):
            raise ValueError(f"{self.task_id}: loss mask does not match the generated segments")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.logprobs)):
            raise ValueError(f"{self.task_id}: logprobs set on masked tokens")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["policy_version"] = self.policy_version
        d["policy_versions"] = self.policy_versions
        d["num_generated_tokens"] = self.num_generated_tokens
        d["num_tokens"] = len(self.token_ids)
        d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"trajectory schema version {d.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in d.items() if k in known}
        fields["segments"] = [Segment(**s) for s in d["segments"]]
        if fields.get("infra_fault") is not None:
            fields["infra_fault"] = InfraFault(**fields["infra_fault"])
        return cls(**fields)


# ------------------------------------------------------------ control plane
@dataclass(frozen=True)
class InterfaceUpdate:
    """Coordinator -> env actors: the training interface's new state."""

    version: int
    state: dict[str, Any]  # InterfaceState.to_dict()


@dataclass(frozen=True)
class RoundEnd:
    """Coordinator -> driver, closing a learner step's round: the training interface now in force."""

    interface_version: int
    active_guidelines: tuple[str, ...]
    pushed_to: int  # env actors the new version went to (0: the interface did not change)
    state: dict[str, Any]  # InterfaceState.to_dict(), written with the step's row


@dataclass(frozen=True)
class TagSummary:
    """Env/rollout side -> coordinator: tags of one finished trajectory."""

    task_id: str
    category: str
    tags: list[str]
    labels: list[str]
    reward: float
    success: bool
    progress: float
    interface_version: int


@dataclass(frozen=True)
class Control:
    """`seal scale` (or any operator tool) -> the running orchestrator, over its
    control socket: ``scale`` with args {"env": N}, ``status``."""

    command: str
    args: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------- orchestrator <-> env actors
@dataclass(frozen=True)
class GroupJob:
    """Orchestrator -> env actor: play one GRPO group of ``n`` rollouts of a task.

    ``slot`` is the task's position in the training stream: a re-issued job
    (after a crash) keeps its slot and gets a new group id, so the learner sees
    each slot's group exactly once."""

    slot: int
    task_id: str
    group_id: str
    n: int
    seed: int
    attempt: int = 0
    generator: str = ""  # the generator replica (Ray actor name) the router chose; "" = the env actor's default
    # Wall-clock budget of each episode (trainer.episode_deadline_s): past it the episode ends as an
    # infra fault of kind "deadline". None: no budget.
    episode_deadline_s: float | None = None


@dataclass
class GroupStats:
    """What generating a group cost: counted while it plays (rollout/play.py), reported with it
    (``GroupReport.generation``)."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prefix-cache hits
    generated_tokens: int = 0
    generate_s: float = 0.0  # waiting for the generator

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# A group job that raised (its generator replica gone: GeneratorUnavailable, or any other error)
# sends nothing and returns no report: the exception carries, under this attribute, the tokens
# the group had generated, for the driver's token books (``lost``; replay/token_ledger.py).
LOST_TOKENS_ATTR = "generated_tokens"


@dataclass(frozen=True)
class GroupReport:
    """Env actor -> orchestrator, after the group's trajectories went to the
    replay queue (the trajectories themselves travel over ZeroMQ): counts and
    per-stage timings."""

    slot: int
    group_id: str
    task_id: str
    actor: str
    sent: int
    interface_version: int
    start_version: int
    generation: GroupStats
    env_s: float  # env steps, verifier and diagnosis
    send_s: float  # handing frames to the transport (back-pressure shows here)
    wall_s: float
    env_steps: int
    tool_calls: int
    rewards: tuple[float, ...] = ()  # per rollout, in rollout order: the driver's progress line shows them
    faults: tuple[str, ...] = ()  # per rollout: its infra fault's kind, "" for none (its reward is not the policy's)
