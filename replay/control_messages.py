"""The control plane: the typed messages the driver, the coordinator, the env actors and the
operator's tools send each other (Ray calls, and the control socket for ``Control``). The
trajectories themselves, the data plane, are replay/messages.py's.

Each message opens with ``# producer -> consumer``, the modules that build it and read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


# actors/coordinator/service.py (InterfaceState.to_dict) -> InterfaceUpdate.state and RoundEnd.state
@dataclass(frozen=True, kw_only=True)
class InterfaceStateMessage:
    """The training interface's state as it travels: the fields of env_pool/interface/state.py
    InterfaceState (replay imports no env_pool; tests/unit/replay/test_control_messages.py holds the
    two to the same fields). Plain values only, so msgpack carries it as well as Ray's pickle;
    ``from_dict(state.to_dict())`` builds it, ``InterfaceState.from_dict(message.to_dict())`` reads it."""

    version: int
    schema_lite: bool
    schema_show_types: bool
    schema_drop_optional: bool
    error_feedback: bool
    guidelines: bool
    worked_examples: bool
    active_guidelines: tuple[str, ...]
    category_guidelines: dict[str, tuple[str, ...]]  # category -> guideline kinds

    def __post_init__(self) -> None:  # msgpack and JSON give lists: equal states compare equal
        object.__setattr__(self, "active_guidelines", tuple(self.active_guidelines))
        object.__setattr__(self, "category_guidelines", {k: tuple(v) for k, v in self.category_guidelines.items()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InterfaceStateMessage:
        names = [f.name for f in fields(cls)]
        wrong = sorted(set(data) ^ set(names))
        if wrong:
            raise ValueError(f"an interface state has exactly the fields {names}; these differ: {wrong}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (rounds.jsonl) and what InterfaceState.from_dict takes."""
        out = asdict(self)
        out["active_guidelines"] = list(self.active_guidelines)
        out["category_guidelines"] = {k: list(v) for k, v in self.category_guidelines.items()}
        return out


# actors/coordinator/service.py (CoordinatorService) -> actors/env_actor.py (EnvActor.set_interface)
@dataclass(frozen=True)
class InterfaceUpdate:
    """Coordinator -> env actors: the training interface's new state."""

    version: int
    state: InterfaceStateMessage


# actors/coordinator/service.py (end_round) -> seal/run/learner_steps.py, seal/run/step_metrics.py
@dataclass(frozen=True)
class RoundEnd:
    """Coordinator -> driver, closing a learner step's round: the training interface now in force."""

    interface_version: int
    active_guidelines: tuple[str, ...]
    pushed_to: int  # env actors the new version went to (0: the interface did not change)
    state: InterfaceStateMessage  # written with the step's row (rounds.jsonl)


# seal/run/learner_steps.py (the trained and filtered trajectories) -> actors/coordinator (record)
@dataclass(frozen=True, kw_only=True)  # eight fields, four of one type: named at every call
class TagSummary:
    """Driver -> coordinator: the tags of one finished trajectory, for the failure profile."""

    task_id: str
    category: str
    tags: list[str]
    labels: list[str]
    reward: float
    success: bool
    progress: float
    interface_version: int


# seal/runtime/control.py (the `seal scale` client, over the control socket) -> seal/runtime/control.py (server)
@dataclass(frozen=True)
class Control:
    """`seal scale` (or any operator tool) -> the running orchestrator, over its
    control socket: ``scale`` with args {"env": N}, ``status``."""

    command: str
    args: dict[str, Any] = field(default_factory=dict)


# replay/slots.py (via seal/run/dispatch.py) -> actors/env_actor.py (EnvActor.run_group)
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
    # trainer.episode_version: "latest" (each turn on the newest policy version) or "pinned" (each
    # episode on the version its first turn ran on: actors/generation/episode_pins.py).
    episode_version: str = "latest"
    # trainer.reference_logprobs: "learner" (the learner's own reference forward) or "generator" (each
    # trajectory carries its base-model log-probs from the replica that played it: LoRA only).
    reference_logprobs: str = "learner"


# rollout/play.py (counted while a group plays) -> GroupReport.generation (seal/run/dispatch.py)
@dataclass
class GroupStats:
    """What generating a group cost: counted while it plays (rollout/play.py), reported with it
    (``GroupReport.generation``)."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prefix-cache hits
    generated_tokens: int = 0
    generate_s: float = 0.0  # waiting for the generator
    reference_s: float = 0.0  # waiting for the replica's reference log-probs (trainer.reference_logprobs=generator)
    reference_tokens: int = 0  # tokens the replica scored for them

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# A group job that raised (its generator replica gone: GeneratorUnavailable, or any other error)
# sends nothing and returns no report: the exception carries, under this attribute, the tokens
# the group had generated, for the driver's token books (``lost``; replay/token_ledger.py).
LOST_TOKENS_ATTR = "generated_tokens"


# actors/env_actor.py (EnvActor.run_group's answer) -> seal/run/dispatch.py, seal/run/step_metrics.py
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
