"""What crosses the generator -> replay queue boundary: the data plane.

One typed record per rollout (docs/design.md, the trajectory record). Producers: rollout workers
(rollout/play.py). Consumers: the replay queue and the learner. JSONL and
(with the async pipeline) msgpack both come from ``to_dict``. The control plane's messages
(jobs, reports, interface updates, the control socket's commands) are replay/control_messages.py's.
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
    # trainer.reference_logprobs=generator (LoRA): the KL reference's log-prob of each generated token,
    # from a replica's base model (no adapter), 0.0 where loss_mask is 0; the learner then skips its
    # reference forward. None: the learner computes it. Optional within schema 2 (absent reads None).
    reference_logprobs: list[float] | None = None

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
        ref = self.reference_logprobs
        if ref is not None:
            if len(ref) != n:
                raise ValueError(f"{self.task_id}: {len(ref)} reference logprobs for {n} tokens")
            if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, ref)):
                raise ValueError(f"{self.task_id}: reference logprobs set on masked tokens")

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
