"""BFCL V3 multi-turn as an episode environment for actors (the step loop: env_pool/multi_turn.py)."""

from __future__ import annotations

from collections.abc import Sequence

from env_pool.base import Message, TokenCounter
from env_pool.bfcl.judge import Diagnosis, judge
from env_pool.bfcl.prompts import reveal_message, system_prompt, template_tools
from env_pool.bfcl.replay import ground_truth_turns
from env_pool.bfcl.runtime import ExecCall, InstanceSet, call_signatures, error_text, is_error_result
from env_pool.bfcl.tasks import BfclTask, get_task, split_ids
from env_pool.interface.examples import exchange_messages, placeholder_exchange
from env_pool.interface.feedback import tool_error_hint, unknown_tool_hint
from env_pool.multi_turn import MultiTurnEnv
from env_pool.tool_calls import Signatures, ToolCall

DEFAULT_STEP_LIMIT = 20  # bfcl-eval's MAXIMUM_STEP_LIMIT


class BfclEnv(MultiTurnEnv[BfclTask]):
    kind = "bfcl"

    def __init__(
        self,
        tool_format: str = "json",
        step_limit: int = DEFAULT_STEP_LIMIT,
        tool_doc_indent: int | None = None,
        max_context_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        instance_mismatch: str = "release",
        tools_in_template: bool = False,
    ) -> None:
        """``tools_in_template``: on the training interface, the opening system message carries the tools
        (``"tools"``, JSON Schema) for the chat template's own tools block instead of the prompt's text;
        the raw interface always shows the benchmark's prompt."""
        super().__init__(tool_format, step_limit, instance_mismatch, max_context_tokens, token_counter)
        self.tool_doc_indent = tool_doc_indent
        self.tools_in_template = tools_in_template
        self._instances: InstanceSet | None = None

    def task_ids(self, split: str = "all") -> list[str]:
        return split_ids(split)

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return ground_truth_turns(get_task(task_id), self.tool_format)

    def user_messages(self, turn: int) -> list[Message]:
        task = self.task
        if turn in task.withheld:
            return [
                {
                    "role": "user",
                    "content": reveal_message(
                        task.withheld[turn], self.tool_format, self.interface, self.tool_doc_indent
                    ),
                }
            ]
        return [dict(m) for m in self._turn_messages(turn)]

    # ------------------------------------------------------------ hooks
    def load_task(self, task_id: str) -> BfclTask:
        return get_task(task_id)

    def open_episode(self, task: BfclTask) -> list[Message]:
        self._instances = InstanceSet(task.initial_config, list(task.involved_classes), task.long_context)
        in_template = self.tools_in_template and not self.interface.is_raw
        tools = task.tools_at_turn(0)
        sys_msg = system_prompt(
            tools, self.tool_format, self.interface, task.category, self.tool_doc_indent, not in_template
        )
        first = [dict(m) for m in self._turn_messages(0)]
        if first and first[0]["role"] == "system":  # as bfcl-eval: ours goes first
            first[0]["content"] = sys_msg + "\n\n" + first[0]["content"]
            head, first = first[:1], first[1:]
        else:
            head = [{"role": "system", "content": sys_msg}]
        if in_template:
            head[0]["tools"] = template_tools(tools, self.interface)
        return head + self._worked_examples(task) + first

    def signatures(self) -> Signatures:
        return call_signatures(self.task.involved_classes)

    def tool_names(self, turn: int) -> list[str]:
        return [doc["name"] for doc in self.task.tools_at_turn(turn)]

    def execute(self, call: ToolCall, turn: int) -> str:
        assert self._instances is not None  # open_episode made them; release drops them after the end
        result = self._instances.execute(ExecCall(call.name, (), dict(call.arguments)))
        if not self.interface.error_feedback:
            return result
        visible = self.tool_names(turn)
        if call.name not in visible:
            return f"{result}\n{unknown_tool_hint(call.name, visible)}"
        if is_error_result(result):
            hint = tool_error_hint(error_text(result))
            if hint:
                return f"{result}\n{hint}"
        return result

    def judge(self) -> Diagnosis:
        return judge(self.task, self.parsed_turns, self.instance_mismatch)

    def release(self) -> None:
        self._instances = None  # free the episode's state now

    # ---------------------------------------------------------- helpers
    def _turn_messages(self, turn: int) -> Sequence[Message]:
        return self.task.questions[turn]

    def _worked_examples(self, task: BfclTask) -> list[Message]:
        """Training interface only: one placeholder call to a task tool, before the first user turn."""
        if not self.interface.worked_examples:
            return []
        exchange = placeholder_exchange(task.tools_at_turn(0))
        return exchange_messages([exchange], self.tool_format) if exchange else []
