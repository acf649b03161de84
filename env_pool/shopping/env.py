"""The shopping-list environment: BFCL's episode shape at a size a 135M model can learn.

Several user turns per task, one stateful API class whose end state is checked,
tool errors to recover from, turns that expect no call; the same tool-call
formats, tags and training interface (observation_lite, error hints,
guidelines, worked exchanges) as env_pool/bfcl. A step with no call ends the
user turn, as in BFCL; the per-turn step limit ends a runaway turn and the
episode.
"""
from __future__ import annotations

import json
import time

from env_pool import tags as T
from env_pool.base import Environment, EpisodeResult, EpisodeStateError, Message, Outcome, StepResult, TokenCounter
from env_pool.interface.examples import Exchange, exchange_messages
from env_pool.interface.feedback import parse_failure_hint, tool_error_hint, unknown_tool_hint
from env_pool.interface.guidelines import guideline_block
from env_pool.interface.schema_lite import SYSTEM_LINE, annotate_tools
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.shopping.tasks import ShoppingTask, get_task, task_ids
from env_pool.shopping.tools import SIGNATURES, TOOL_NAMES, TOOLS, ShoppingList, is_error
from env_pool.shopping.verifier import judge
from env_pool.tool_calls import FORMATS, ParsedStep, ToolCall, parse_step, render_calls

# The benchmark's own few-shot prompt, part of its definition and the same at every
# snapshot, in every run and in both interfaces: a request that lacks its quantity
# (ask first, then add), an add, a remove, a look at the list, a thank-you that needs
# no call, and a request dropped after the question. Without them SmolLM2-135M never
# calls a tool (0% in every category). The order decides the base rates, which must be
# above zero and well below the ceiling so that gains and losses both show (greedy,
# 40 test tasks per category, 2026-12-03): this order 45% base / 72% miss_param; the
# ask-first exchange fourth 8% / 91%; without it 65% / 2%; without its answer 5% / 0%.
# Their items (pear, yogurt) are never in a task, so they show the call format and the
# turn shapes, not an answer. Results are made up.
def _call_exchange(request: str, call: ToolCall, result: str, reply: str) -> Exchange:
    return (request, call, result, reply)


ASK_FIRST: tuple[Message, ...] = (
    {"role": "user", "content": "Please add some yogurt to my shopping list."},
    {"role": "assistant", "content": "How many yogurt would you like?"},
)
ASK_ANSWERED = _call_exchange("3 of them, please.", ToolCall("add_item", {"item": "yogurt", "quantity": 3}),
                              '{"added": "yogurt", "quantity": 3}', "I added 3 yogurt to your list.")
BENCHMARK_EXCHANGES: tuple[Exchange, ...] = (
    _call_exchange("Please add pear to my shopping list, quantity 2.", ToolCall("add_item", {"item": "pear", "quantity": 2}),
                   '{"added": "pear", "quantity": 2}', "I added 2 pear to your list."),
    _call_exchange("Please remove yogurt from my shopping list.", ToolCall("remove_item", {"item": "yogurt"}),
                   '{"removed": "yogurt", "items": {"pear": 2}}', "I removed yogurt from your list."),
    _call_exchange("What is on my shopping list now?", ToolCall("view_list", {}), '{"items": {"pear": 2}}',
                   "Your list has 2 pear."),
)
NO_CALL_EXCHANGE: tuple[Message, ...] = (
    {"role": "user", "content": "Thank you!"},
    {"role": "assistant", "content": "You are welcome. Tell me if you need anything else."},
)
ASK_DROPPED: tuple[Message, ...] = (
    {"role": "user", "content": "Please add some pear to my shopping list."},
    {"role": "assistant", "content": "How many pear would you like?"},
    {"role": "user", "content": "Never mind, thanks."},
    {"role": "assistant", "content": "All right. Tell me if you need anything else."},
)
def benchmark_messages(fmt: str, bare: bool = False) -> list[Message]:
    """The benchmark's few-shot turns: in every episode, raw or training interface."""
    return ([dict(m) for m in ASK_FIRST] + exchange_messages([ASK_ANSWERED, *BENCHMARK_EXCHANGES], fmt, bare)
            + [dict(m) for m in (*NO_CALL_EXCHANGE, *ASK_DROPPED)])


class ShoppingEnv(Environment):
    kind = "shopping"

    def __init__(self, tool_format: str = "python", step_limit: int = 3, instance_mismatch: str = "release",
                 max_context_tokens: int | None = None, token_counter: TokenCounter | None = None,
                 bare_calls: bool = True) -> None:
        """``bare_calls``: the prompt shows a single python call without the list's brackets
        (``add_item(...)``, not ``[add_item(...)]``); either parses. SmolLM2-135M starts a bare
        call about 7x more often (docs/main-job.md: the CPU default)."""
        super().__init__()
        if tool_format not in FORMATS:
            raise ValueError(f"tool_format must be one of {FORMATS}, got {tool_format!r}")
        if step_limit < 1:
            raise ValueError(f"step_limit must be >= 1, got {step_limit}")
        if (max_context_tokens is None) != (token_counter is None):
            raise ValueError("max_context_tokens and token_counter go together")
        self.instance_mismatch = T.check_instance_mismatch_rule(instance_mismatch)
        self.tool_format = tool_format
        self.bare_calls = bare_calls and tool_format == "python"
        self.step_limit = step_limit
        self.max_context_tokens = max_context_tokens
        self.token_counter = token_counter
        self._task: ShoppingTask | None = None
        self._done = True

    def task_ids(self, split: str = "all") -> list[str]:
        return task_ids(split)

    def system_prompt(self, interface: InterfaceState, category: str | None = None) -> str:
        tools = "\n".join(json.dumps(t) for t in annotate_tools(TOOLS, interface))
        example = render_calls([ToolCall("add_item", {"item": "pear", "quantity": 2})], self.tool_format, self.bare_calls)
        prompt = (
            "You are a shopping-list assistant with tools. To use a tool, reply with only the call, for example:\n"
            f"{example}\nAfter the tool answers, reply to the user in plain text. "
            "If the request needs no tool, or lacks a detail you need, reply in plain text.\n"
            f"Tools:\n{tools}\n"
        )
        extras = ([SYSTEM_LINE] if interface.schema_lite else []) + [b for b in [guideline_block(interface.guidelines_for(category))] if b]
        return prompt + ("\n" + "\n\n".join(extras) + "\n" if extras else "")

    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]:
        task = self._task = get_task(task_id)
        self._interface = interface or RAW_INTERFACE
        self._list = ShoppingList(dict(task.initial))
        self._messages: list[Message] = [{"role": "system", "content": self.system_prompt(self._interface, task.category)}]
        # The benchmark's exchanges, whatever the interface: interface.worked_examples adds none here.
        # A further training-only exchange (a tool error read and the call repeated, before or
        # after these) cut the training interface's success at temperature 0.7 from 22% / 48%
        # (base / miss_param, 40 train tasks each) to 2% / 30% or 25% / 10%.
        self._messages += benchmark_messages(self.tool_format, self.bare_calls)
        self._messages.append({"role": "user", "content": task.turns[0].user})
        self._turn = self._steps_in_turn = 0
        self._turn_texts: list[list[str]] = [[]]
        self._turn_parsed: list[list[ParsedStep]] = [[]]
        self._num_steps = self._num_calls = self._num_parse_errors = 0
        self._outcome: Outcome | None = None
        self._result: EpisodeResult | None = None
        self._done = False
        self._env_seconds = 0.0
        self._check_context()
        return list(self._messages)

    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def done(self) -> bool:
        return self._done

    def reference_turns(self, task_id: str) -> list[list[str]]:
        turns = get_task(task_id).turns
        return [([render_calls(list(t.expected), self.tool_format, self.bare_calls)] if t.expected else []) + ["Done."] for t in turns]

    def step(self, assistant_text: str) -> StepResult:
        if self._task is None or self._done:
            raise EpisodeStateError("step() needs an episode in progress: call reset() first")
        t0 = time.perf_counter()
        turn = self._turn
        parsed = parse_step(assistant_text, self.tool_format, SIGNATURES)
        self._turn_texts[turn].append(assistant_text)
        self._turn_parsed[turn].append(parsed)
        self._messages.append({"role": "assistant", "content": assistant_text})
        self._num_steps += 1
        new: list[Message] = []
        end_turn = False
        if parsed.error is not None:
            self._num_parse_errors += 1
            if self._interface.error_feedback:
                new.append({"role": "tool", "name": "parse_error", "content": parse_failure_hint(self.tool_format, parsed.error, TOOL_NAMES)})
            else:
                end_turn = True  # as BFCL: a step that fails to decode ends the turn
        elif not parsed.calls:
            end_turn = True
        for call in parsed.calls:
            new.append({"role": "tool", "name": call.name, "content": self._with_hint(call.name, self._list.execute(call))})
        self._num_calls += len(parsed.calls)
        self._steps_in_turn += 0 if end_turn else 1
        outcome: Outcome | None = None
        if not end_turn and self._steps_in_turn >= self.step_limit:
            outcome = Outcome.STEP_LIMIT
        elif end_turn:
            if turn + 1 >= self._task.num_turns:
                outcome = Outcome.COMPLETED
            else:
                self._turn, self._steps_in_turn = turn + 1, 0
                self._turn_texts.append([])
                self._turn_parsed.append([])
                new.append({"role": "user", "content": self._task.turns[self._turn].user})
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
            # An episode the step limit or the context cut off fails as force-terminated.
            verdict = judge(task, self._turn_parsed, self.instance_mismatch, cut_off=self._outcome != Outcome.COMPLETED)
            self._result = EpisodeResult(
                env=self.kind, task_id=task.id, category=task.category, reward=verdict.reward, success=bool(verdict.reward),
                progress=verdict.progress, tags=list(verdict.tags), labels=list(verdict.labels), error_type=verdict.error_type,
                outcome=(self._outcome or Outcome.ABORTED).value, interface_version=self._interface.version,
                num_steps=self._num_steps, num_tool_calls=self._num_calls, num_parse_errors=self._num_parse_errors,
                turns=[list(t) for t in self._turn_texts], env_seconds=self._env_seconds, judge_seconds=time.perf_counter() - t0,
            )
        return self._result

    def _with_hint(self, name: str, result: str) -> str:
        if not self._interface.error_feedback:
            return result
        if name not in TOOL_NAMES:
            return f"{result}\n{unknown_tool_hint(name, TOOL_NAMES)}"
        hint = tool_error_hint(json.loads(result)["error"]) if is_error(result) else None
        return f"{result}\n{hint}" if hint else result

    def _check_context(self) -> None:
        if self.token_counter is None or self._done:
            return
        if self.token_counter(self._messages) > self.max_context_tokens:  # type: ignore[operator]
            self._finish(Outcome.CONTEXT_OVERFLOW)

    def _finish(self, outcome: Outcome) -> None:
        self._done = True
        self._outcome = outcome
        self.stats.record(outcome, self._num_steps, self._num_calls, self._num_parse_errors)
