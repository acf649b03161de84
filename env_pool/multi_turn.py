"""The one multi-turn step loop every tool environment runs (the episode API of env_pool/base.py).

A step decodes the assistant text in the env's tool format, then:
- a step that fails to decode gets a format hint under the training interface
  (``error_feedback``) and ends the user turn under the raw one, as bfcl-eval's
  inference loop does;
- a step with no call ends the user turn: the next user turn begins, or, after
  the last one, the episode is completed;
- otherwise its calls are executed in order and each answered by a tool message.

The per-turn step limit is bfcl-eval's (``count > MAXIMUM_STEP_LIMIT``): a turn
may take ``step_limit`` steps that do not end it; the step past that ends the
whole episode with ``Outcome.STEP_LIMIT`` (its calls still ran, as in bfcl-eval).
BFCL's official agreement depends on this exact boundary, so it is the only one.

An environment subclasses ``MultiTurnEnv`` and supplies its hooks: the task
(``load_task``), the opening messages (``open_episode``), the parser's
``signatures``, the ``tool_names`` a turn sees, ``execute`` for one call, the
next turn's ``user_messages`` and the verdict (``judge``); it reads the episode
through ``task``, ``interface``, ``turn_texts``, ``parsed_turns`` and ``outcome``.
Everything else (counters, outcomes, the context check, stats, the
``EpisodeResult``) lives here once. env_pool/tool_env.py builds most hooks from
Python functions.
"""

from __future__ import annotations

import abc
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from env_pool import tags as T
from env_pool.base import Environment, EpisodeResult, EpisodeStateError, Message, Outcome, StepResult, TokenCounter
from env_pool.contract import check_verdict
from env_pool.interface.feedback import parse_failure_hint
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.tool_calls import FORMATS, ParsedStep, Signatures, ToolCall, parse_step


class Task(Protocol):
    """What the step loop reads of a task (read-only: a frozen dataclass is one)."""

    @property
    def id(self) -> str: ...

    @property
    def category(self) -> str: ...

    @property
    def num_turns(self) -> int: ...


class Judged(Protocol):
    """What an env's verifier says about a finished episode (read-only: a frozen dataclass is one)."""

    @property
    def reward(self) -> float: ...  # in [0, 1]: 0 or 1 from a binary verifier, partial credit between

    @property
    def progress(self) -> float | None: ...  # None: the reward

    @property
    def tags(self) -> Sequence[str]: ...  # released vocabulary, one per user turn; none: every turn unknown

    @property
    def labels(self) -> Sequence[str]: ...  # paper vocabulary, one per user turn; none: every turn unknown

    @property
    def error_type(self) -> str | None: ...


@dataclass(frozen=True)
class Verdict:
    """A verdict to return from ``judge``: only the reward is required. Without tags and labels it is
    reward-only: every user turn is tagged ``unknown``, which the A-Patch weights leave at 1 and no
    guideline answers (docs/custom-environment.md, the verdict); a bare number from ``judge`` is one."""

    reward: float
    progress: float | None = None  # for logging (e.g. passed turns / turns); None: the reward
    tags: Sequence[str] = ()  # env_pool.tags.RELEASED_TAGS, one per user turn
    labels: Sequence[str] = ()  # env_pool.tags.PAPER_LABELS, one per user turn
    error_type: str | None = None  # why the episode failed (None: it passed, or no reason given)


def _verdict(judged: Judged | float, num_turns: int) -> Judged:
    """A bare reward as a Verdict; a verdict without tags and labels gets ``unknown`` for every turn."""
    if isinstance(judged, (int, float)):
        judged = Verdict(judged)
    if len(judged.tags) == len(judged.labels) == 0:
        unknown = (T.UNKNOWN,) * num_turns
        judged = Verdict(judged.reward, judged.progress, unknown, unknown, judged.error_type)
    return judged


TaskT = TypeVar("TaskT", bound=Task)
# The hooks' names before they were public: (old, new). A subclass that still defines an old name
# works for one more release, with one warning line naming the new one.
RENAMED_HOOKS: tuple[tuple[str, str], ...] = (
    ("_load", "load_task"),
    ("_open", "open_episode"),
    ("_signatures", "signatures"),
    ("_tool_names", "tool_names"),
    ("_execute", "execute"),
    ("_judge", "judge"),
    ("_release", "release"),
)


class MultiTurnEnv(Environment, Generic[TaskT]):
    """``MultiTurnEnv[MyTask]``: ``self.task`` is a ``MyTask`` to the type checker."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_HOOKS:
            mine = vars(cls)
            if old in mine and new not in mine:
                warnings.warn(
                    f"{cls.__module__}.{cls.__qualname__}.{old} is the old name of the hook {new}: rename it "
                    "(the old name works until the next release; docs/custom-environment.md)",
                    FutureWarning,
                    stacklevel=2,
                )
                setattr(cls, new, mine[old])
            elif new in mine and old not in mine:
                setattr(cls, old, mine[new])  # a subclass's super().{old}() still reaches this class

    def __init__(
        self,
        tool_format: str,
        step_limit: int,
        instance_mismatch: str = "release",
        max_context_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        super().__init__()
        if tool_format not in FORMATS:
            raise ValueError(f"tool_format must be one of {FORMATS}, got {tool_format!r}")
        if step_limit < 1:
            raise ValueError(f"step_limit must be >= 1, got {step_limit}")
        if (max_context_tokens is None) != (token_counter is None):
            raise ValueError("max_context_tokens and token_counter go together")
        self.instance_mismatch = T.check_instance_mismatch_rule(instance_mismatch)
        self.tool_format = tool_format
        self.step_limit = step_limit
        self.max_context_tokens = max_context_tokens
        self.token_counter = token_counter
        self._task: TaskT | None = None
        self._interface = RAW_INTERFACE
        self._done = True

    # ------------------------------------------------------------ hooks
    @abc.abstractmethod
    def load_task(self, task_id: str) -> TaskT:
        """The task of ``task_id``; a KeyError names an unknown id."""

    @abc.abstractmethod
    def open_episode(self, task: TaskT) -> list[Message]:
        """Set up the episode's tool state and return its opening messages (the first user turn last)."""

    @abc.abstractmethod
    def signatures(self) -> Signatures:
        """Parameter names per tool, to bind python-format positional arguments."""

    @abc.abstractmethod
    def tool_names(self, turn: int) -> list[str]:
        """The tools the agent sees at ``turn`` (named in feedback hints)."""

    @abc.abstractmethod
    def execute(self, call: ToolCall, turn: int) -> str:
        """Run one call; the tool message's content (with its hint under ``error_feedback``)."""

    @abc.abstractmethod
    def user_messages(self, turn: int) -> list[Message]:
        """The messages that open user turn ``turn``."""

    @abc.abstractmethod
    def judge(self) -> Judged | float:
        """The verifier's verdict on the finished episode (``parsed_turns``, ``turn_texts``, ``outcome``): a
        ``Verdict`` (or an env's own class with its fields), or a bare reward."""

    def release(self) -> None:
        """Free per-episode tool state once the episode ends (nothing by default)."""

    # ------------------------------------------------------ the episode, for the hooks
    @property
    def task(self) -> TaskT:
        """The current episode's task (EpisodeStateError before the first ``reset``)."""
        if self._task is None:
            raise EpisodeStateError(f"{type(self).__name__}.task: no episode yet; call reset() first")
        return self._task

    @property
    def interface(self) -> InterfaceState:
        """The interface the current episode runs under (the raw one before any)."""
        return self._interface

    @property
    def turn_texts(self) -> list[list[str]]:
        """The model's text of each step, per user turn so far (the last list: the turn it is in)."""
        return self._turn_texts

    @property
    def parsed_turns(self) -> list[list[ParsedStep]]:
        """Each step decoded in the env's tool format (its calls, or its parse error), per user turn."""
        return self._turn_parsed

    @property
    def outcome(self) -> Outcome | None:
        """How the episode ended (None while it runs): completed, step_limit, context_overflow, aborted."""
        return self._outcome

    # -------------------------------------------------------------- API
    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]:
        task = self.load_task(task_id)
        self._task = task
        self._interface = interface or RAW_INTERFACE
        self._turn = self._steps_in_turn = 0
        self._turn_texts: list[list[str]] = [[]]
        self._turn_parsed: list[list[ParsedStep]] = [[]]
        self._num_steps = self._num_calls = self._num_parse_errors = 0
        self._outcome: Outcome | None = None
        self._result: EpisodeResult | None = None
        self._done = False
        self._env_seconds = 0.0
        self._messages: list[Message] = self.open_episode(task)
        self._check_context()
        return list(self._messages)

    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def done(self) -> bool:
        return self._done

    def step(self, assistant_text: str) -> StepResult:
        if self._task is None or self._done:
            state = "no episode yet" if self._task is None else f"{self._task.id} ended ({self._outcome_name()})"
            raise EpisodeStateError(f"{type(self).__name__}.step: {state}; call reset() first")
        t0 = time.perf_counter()
        turn = self._turn
        parsed = parse_step(assistant_text, self.tool_format, self.signatures())
        self._turn_texts[turn].append(assistant_text)
        self._turn_parsed[turn].append(parsed)
        self._messages.append({"role": "assistant", "content": assistant_text})
        self._num_steps += 1
        new: list[Message] = []
        end_turn = False
        if parsed.error is not None:
            self._num_parse_errors += 1
            if self._interface.error_feedback:
                hint = parse_failure_hint(self.tool_format, parsed.error, self.tool_names(turn))
                new.append({"role": "tool", "name": "parse_error", "content": hint})
            else:
                end_turn = True  # bfcl-eval: a step that fails to decode ends the turn
        elif not parsed.calls:
            end_turn = True
        else:
            for call in parsed.calls:
                new.append({"role": "tool", "name": call.name, "content": self.execute(call, turn)})
            self._num_calls += len(parsed.calls)

        outcome: Outcome | None = None
        if not end_turn:
            self._steps_in_turn += 1
            if self._steps_in_turn > self.step_limit:
                outcome = Outcome.STEP_LIMIT  # bfcl-eval force-quits the whole entry
        elif turn + 1 >= self._task.num_turns:
            outcome = Outcome.COMPLETED
        else:
            self._turn, self._steps_in_turn = turn + 1, 0
            self._turn_texts.append([])
            self._turn_parsed.append([])
            new.extend(self.user_messages(self._turn))
        self._messages.extend(new)
        if outcome is None:
            self._check_context()
        else:
            self._finish(outcome)
        self._env_seconds += time.perf_counter() - t0
        return StepResult(new, turn, end_turn, self._done, self._outcome, len(parsed.calls), parsed.error)

    def end(self, outcome: Outcome) -> None:
        if self._task is None:
            raise EpisodeStateError("end() needs an episode: call reset() first")
        if not self._done:
            self._finish(outcome)

    def result(self) -> EpisodeResult:
        if self._task is None or not self._done:
            raise EpisodeStateError("result() is available once the episode is done")
        if self._result is None:
            t0 = time.perf_counter()
            task = self._task
            verdict = _verdict(self.judge(), task.num_turns)
            check_verdict(self, verdict.reward, verdict.tags, verdict.labels)
            reward = int(verdict.reward) if isinstance(verdict.reward, bool) else verdict.reward
            self._result = EpisodeResult(
                env=self.kind,
                task_id=task.id,
                category=task.category,
                reward=reward,  # as the verifier gave it: a binary one's int stays an int
                success=reward >= self.success_threshold,
                progress=reward if verdict.progress is None else verdict.progress,
                tags=list(verdict.tags),
                labels=list(verdict.labels),
                error_type=verdict.error_type,
                outcome=(self._outcome or Outcome.ABORTED).value,
                interface_version=self._interface.version,
                num_steps=self._num_steps,
                num_tool_calls=self._num_calls,
                num_parse_errors=self._num_parse_errors,
                turns=[list(t) for t in self._turn_texts],
                env_seconds=self._env_seconds,
                judge_seconds=time.perf_counter() - t0,
            )
        return self._result

    # ---------------------------------------------------------- helpers
    def _outcome_name(self) -> str:
        return (self._outcome or Outcome.ABORTED).value

    def _check_context(self) -> None:
        if self.token_counter is None or self._done:
            return
        if self.token_counter(self._messages) > self.max_context_tokens:  # type: ignore[operator]
            self._finish(Outcome.CONTEXT_OVERFLOW)

    def _finish(self, outcome: Outcome) -> None:
        self._done = True
        self._outcome = outcome
        self.release()
        self.stats.record(outcome, self._num_steps, self._num_calls, self._num_parse_errors)
