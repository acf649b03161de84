"""The environment interface every environment kind implements.

An episode, as an actor drives it:

    messages = env.reset(task_id, interface)          # system + first user turn
    while not done:
        result = env.step(assistant_text)             # executes calls
        messages += [assistant message] + result.messages
        done = result.done
    episode = env.result()                            # reward, tags, labels, ...

``env.messages`` always holds the whole conversation. A driver that must stop
an episode itself (e.g. the prompt no longer fits the model) calls
``env.end(Outcome.CONTEXT_OVERFLOW)``: every end is a named, counted outcome.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from env_pool.interface.state import InterfaceState

Message = dict[str, Any]  # {"role": system|user|assistant|tool, "content": str, "name"?: str}
TokenCounter = Callable[[Sequence[Message]], int]


class Outcome(str, Enum):
    COMPLETED = "completed"  # every user turn was served
    STEP_LIMIT = "step_limit"  # a turn ran past the per-turn step limit
    CONTEXT_OVERFLOW = "context_overflow"  # the conversation outgrew the model's context
    ABORTED = "aborted"  # the driver stopped the episode (e.g. process error)


@dataclass(frozen=True)
class StepResult:
    messages: list[Message]  # to append after the assistant message
    turn_index: int  # the turn the step belonged to
    turn_ended: bool
    done: bool
    outcome: Outcome | None
    num_calls: int
    parse_error: str | None = None


@dataclass(frozen=True)
class EpisodeResult:
    env: str
    task_id: str
    category: str
    reward: float  # in [0, 1]: 0 or 1 for a binary verifier, partial credit between
    success: bool  # reward >= the env's success_threshold
    progress: float
    tags: list[str]  # released vocabulary, one per user turn
    labels: list[str]  # paper vocabulary, one per user turn
    error_type: str | None
    outcome: str
    interface_version: int
    num_steps: int
    num_tool_calls: int
    num_parse_errors: int
    turns: list[list[str]]  # assistant step texts per user turn
    env_seconds: float
    judge_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EnvStats:
    """Counters an env actor reports; memory-flat (no per-episode data kept)."""

    episodes: int = 0
    steps: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    outcomes: Counter = field(default_factory=Counter)

    def record(self, outcome: Outcome, steps: int, tool_calls: int, parse_errors: int) -> None:
        self.episodes += 1
        self.steps += steps
        self.tool_calls += tool_calls
        self.parse_errors += parse_errors
        self.outcomes[outcome.value] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "parse_errors": self.parse_errors,
            "outcomes": dict(self.outcomes),
        }


class EpisodeStateError(RuntimeError):
    """The episode API was used out of order (step before reset, after done...)."""


class Environment(abc.ABC):
    """The episode API (docs/custom-environment.md). ``kind`` names the environment in
    trajectories and errors. The built-in environments are listed in env_pool/registry.py; one
    from elsewhere also sets ``task_prefix`` (every one of its task ids starts with it) and
    ``category_of``, which is how the registry finds a task's environment and category.

    A verdict's reward is a number in [0, 1] (partial credit welcome: GRPO normalises rewards
    within a group, so their scale is free, and [0, 1] is the one the success threshold, the
    coordinator's ``1 - reward_mean`` pressure and the reward charts read). An episode succeeds
    when its reward reaches ``success_threshold``: 1.0, a binary verifier's pass, unless the
    environment says how much partial credit counts as solved (the frozen evaluation's success)."""

    kind: str = "base"
    task_prefix: str = ""
    success_threshold: float = 1.0

    def __init__(self) -> None:
        self.stats = EnvStats()

    @classmethod
    def category_of(cls, task_id: str) -> str:
        """The category of one of this environment's task ids; a KeyError names an unknown id."""
        raise NotImplementedError(f"{cls.__name__} sets task_prefix and must define category_of")

    @abc.abstractmethod
    def task_ids(self, split: str = "all") -> list[str]: ...

    @abc.abstractmethod
    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]: ...

    @abc.abstractmethod
    def step(self, assistant_text: str) -> StepResult: ...

    @abc.abstractmethod
    def end(self, outcome: Outcome) -> None: ...

    @abc.abstractmethod
    def result(self) -> EpisodeResult: ...

    @property
    @abc.abstractmethod
    def messages(self) -> list[Message]: ...

    @property
    @abc.abstractmethod
    def done(self) -> bool: ...

    @abc.abstractmethod
    def reference_turns(self, task_id: str) -> list[list[str]]:
        """Step texts of a correct agent, per user turn (for checks and demos)."""


def play_scripted(
    env: Environment, task_id: str, turns: Sequence[Sequence[str]], interface: InterfaceState | None = None
) -> EpisodeResult:
    """Drive one episode with fixed step texts per turn; the env decides where turns end."""
    env.reset(task_id, interface)
    for turn in turns:
        if env.done:
            break
        for text in turn:
            result = env.step(text)
            if result.turn_ended or result.done:
                break
    if not env.done:
        env.end(Outcome.ABORTED)
    return env.result()
