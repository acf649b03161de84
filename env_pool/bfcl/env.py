"""BFCL V3 multi-turn as an episode environment for actors."""
from __future__ import annotations

import time
from typing import Sequence

from env_pool.base import (
    Environment,
    EpisodeResult,
    EpisodeStateError,
    Message,
    Outcome,
    StepResult,
    TokenCounter,
)
from env_pool.bfcl.judge import judge
from env_pool.bfcl.prompts import reveal_message, system_prompt
from env_pool.bfcl.replay import ground_truth_turns
from env_pool.bfcl.runtime import ExecCall, InstanceSet, call_signatures, error_text, is_error_result
from env_pool.bfcl.tasks import BfclTask, get_task, split_ids
from env_pool.interface.examples import exchange_messages, placeholder_exchange
from env_pool.interface.feedback import parse_failure_hint, tool_error_hint, unknown_tool_hint
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.tags import check_instance_mismatch_rule
from env_pool.tool_calls import FORMATS, ParsedStep, parse_step

DEFAULT_STEP_LIMIT = 20  # bfcl-eval's MAXIMUM_STEP_LIMIT


class BfclEnv(Environment):
    kind = "bfcl"

    def __init__(
        self,
        tool_format: str = "json",
        step_limit: int = DEFAULT_STEP_LIMIT,
        tool_doc_indent: int | None = None,
        max_context_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        instance_mismatch: str = "release",
    ) -> None:
        super().__init__()
        if tool_format not in FORMATS:
            raise ValueError(f"tool_format must be one of {FORMATS}, got {tool_format!r}")
        self.instance_mismatch = check_instance_mismatch_rule(instance_mismatch)
        if step_limit < 1:
            raise ValueError(f"step_limit must be >= 1, got {step_limit}")
        if (max_context_tokens is None) != (token_counter is None):
            raise ValueError("max_context_tokens and token_counter go together")
        self.tool_format = tool_format
        self.step_limit = step_limit
        self.tool_doc_indent = tool_doc_indent
        self.max_context_tokens = max_context_tokens
        self.token_counter = token_counter
        self._task: BfclTask | None = None
        self._done = True

    # ------------------------------------------------------------------ API
    def task_ids(self, split: str = "all") -> list[str]:
        return split_ids(split)

    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]:
        task = get_task(task_id)
        self._task = task
        self._interface = interface or RAW_INTERFACE
        self._instances = InstanceSet(task.initial_config, list(task.involved_classes), task.long_context)
        self._turn = 0
        self._steps_in_turn = 0
        self._turn_texts: list[list[str]] = [[]]
        self._turn_parsed: list[list[ParsedStep]] = [[]]
        self._num_steps = self._num_calls = self._num_parse_errors = 0
        self._outcome: Outcome | None = None
        self._done = False
        self._result: EpisodeResult | None = None
        self._started = time.perf_counter()
        self._env_seconds = 0.0
        sys_msg = system_prompt(task.tools_at_turn(0), self.tool_format, self._interface, task.category, self.tool_doc_indent)
        first = [dict(m) for m in self._turn_messages(0)]
        if first and first[0]["role"] == "system":  # as bfcl-eval: ours goes first
            first[0]["content"] = sys_msg + "\n\n" + first[0]["content"]
            head, first = first[:1], first[1:]
        else:
            head = [{"role": "system", "content": sys_msg}]
        self._messages = head + self._worked_examples(task) + first
        self._check_context()
        return list(self._messages)

    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def done(self) -> bool:
        return self._done

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return ground_truth_turns(get_task(task_id), self.tool_format)

    def step(self, assistant_text: str) -> StepResult:
        if self._task is None or self._done:
            raise EpisodeStateError("step() needs an episode in progress: call reset() first")
        t0 = time.perf_counter()
        task, turn = self._task, self._turn
        parsed = parse_step(assistant_text, self.tool_format, call_signatures(task.involved_classes))
        self._turn_texts[turn].append(assistant_text)
        self._turn_parsed[turn].append(parsed)
        self._messages.append({"role": "assistant", "content": assistant_text})
        self._num_steps += 1
        visible = [doc["name"] for doc in task.tools_at_turn(turn)]
        new: list[Message] = []
        end_turn = False
        if parsed.error is not None:
            self._num_parse_errors += 1
            if self._interface.error_feedback:
                new.append({"role": "tool", "name": "parse_error", "content": parse_failure_hint(self.tool_format, parsed.error, visible)})
            else:
                end_turn = True  # bfcl-eval: a step that fails to decode ends the turn
        elif not parsed.calls:
            end_turn = True
        else:
            for call in parsed.calls:
                result = self._instances.execute(ExecCall(call.name, (), dict(call.arguments)))
                new.append({"role": "tool", "name": call.name, "content": self._with_hint(call.name, result, visible)})
            self._num_calls += len(parsed.calls)
        self._steps_in_turn += 0 if end_turn else 1

        outcome: Outcome | None = None
        if not end_turn and self._steps_in_turn > self.step_limit:
            outcome = Outcome.STEP_LIMIT  # bfcl-eval force-quits the whole entry
        elif end_turn:
            if turn + 1 >= task.num_turns:
                outcome = Outcome.COMPLETED
            else:
                self._turn = turn + 1
                self._steps_in_turn = 0
                self._turn_texts.append([])
                self._turn_parsed.append([])
                new.extend(self.user_messages(self._turn))
        self._messages.extend(new)
        if outcome is None:
            self._check_context()
        else:
            self._finish(outcome)
        self._env_seconds += time.perf_counter() - t0
        return StepResult(
            messages=new,
            turn_index=turn,
            turn_ended=end_turn,
            done=self._done,
            outcome=self._outcome,
            num_calls=len(parsed.calls),
            parse_error=parsed.error,
        )

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
            diag = judge(self._task, self._turn_parsed, self.instance_mismatch)
            self._result = EpisodeResult(
                env=self.kind,
                task_id=self._task.id,
                category=self._task.category,
                reward=diag.reward,
                success=bool(diag.reward),
                progress=diag.progress,
                tags=list(diag.tags),
                labels=list(diag.labels),
                error_type=diag.error_type,
                outcome=self._outcome.value if self._outcome else Outcome.ABORTED.value,
                interface_version=self._interface.version,
                num_steps=self._num_steps,
                num_tool_calls=self._num_calls,
                num_parse_errors=self._num_parse_errors,
                turns=[list(t) for t in self._turn_texts],
                env_seconds=self._env_seconds,
                judge_seconds=time.perf_counter() - t0,
            )
        return self._result

    # -------------------------------------------------------------- helpers
    def _turn_messages(self, turn: int) -> Sequence[Message]:
        return self._task.questions[turn]  # type: ignore[union-attr]

    def user_messages(self, turn: int) -> list[Message]:
        task = self._task
        assert task is not None
        if turn in task.withheld:
            return [{"role": "user", "content": reveal_message(task.withheld[turn], self.tool_format, self._interface, self.tool_doc_indent)}]
        return [dict(m) for m in self._turn_messages(turn)]

    def _worked_examples(self, task: BfclTask) -> list[Message]:
        """Training interface only: one placeholder call to a task tool, before the first user turn."""
        if not self._interface.worked_examples:
            return []
        exchange = placeholder_exchange(task.tools_at_turn(0))
        return exchange_messages([exchange], self.tool_format) if exchange else []

    def _with_hint(self, name: str, result: str, visible: list[str]) -> str:
        if not self._interface.error_feedback:
            return result
        if name not in visible:
            return f"{result}\n{unknown_tool_hint(name, visible)}"
        if is_error_result(result):
            hint = tool_error_hint(error_text(result))
            if hint:
                return f"{result}\n{hint}"
        return result

    def _check_context(self) -> None:
        if self.token_counter is None or self._done:
            return
        if self.token_counter(self._messages) > self.max_context_tokens:  # type: ignore[operator]
            self._finish(Outcome.CONTEXT_OVERFLOW)

    def _finish(self, outcome: Outcome) -> None:
        self._done = True
        self._outcome = outcome
        self._instances = None  # type: ignore[assignment]  # free the episode's state now
        self.stats.record(outcome, self._num_steps, self._num_calls, self._num_parse_errors)
