"""What crosses the generator -> replay queue boundary.

One typed record per rollout (docs/design.md, the trajectory record). Producers: rollout workers
(rollout/play.py). Consumers: the replay queue and the learner. JSONL and
(with the async pipeline) msgpack both come from ``to_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Segment:
    """A span of generated tokens [start, end) and the policy version that produced it."""

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
    error: str | None = None  # a process error (the episode still ends with a record)
    start_version: int = 0  # the generator's policy version when the episode began
    num_parse_errors: int = 0  # assistant steps whose tool calls did not parse
    schema_version: int = SCHEMA_VERSION

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
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"trajectory schema version {d.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in d.items() if k in known}
        fields["segments"] = [Segment(**s) for s in d["segments"]]
        return cls(**fields)


# ------------------------------------------------------------ control plane
@dataclass(frozen=True)
class InterfaceUpdate:
    """Coordinator -> env actors: the training interface's new state."""

    version: int
    state: dict[str, Any]  # InterfaceState.to_dict()


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
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    generate_s: float  # waiting for the generator
    env_s: float  # env steps, verifier and diagnosis
    send_s: float  # handing frames to the transport (back-pressure shows here)
    wall_s: float
    env_steps: int
    tool_calls: int
    rewards: tuple[float, ...] = ()  # per rollout, in rollout order: the driver's progress line shows them
