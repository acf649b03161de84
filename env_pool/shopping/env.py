"""The shopping-list environment: BFCL's episode shape at a size a 135M model can learn.

Several user turns per task, one stateful API class whose end state is checked,
tool errors to recover from, turns that expect no call; the same tool-call
formats, tags and training interface (observation_lite, error hints,
guidelines, worked exchanges) and the same step loop (env_pool/multi_turn.py) as
env_pool/bfcl: a step with no call ends the user turn; the per-turn step limit
ends a runaway turn and the episode.
"""

from __future__ import annotations

from collections.abc import Sequence

from env_pool.base import Message, Outcome, TokenCounter
from env_pool.interface.examples import Exchange, exchange_messages
from env_pool.multi_turn import Verdict
from env_pool.shopping.tasks import SPLITS, ShoppingTask, get_task
from env_pool.shopping.tools import TOOLS, ShoppingList
from env_pool.shopping.verifier import judge
from env_pool.tool_calls import ToolCall, render_calls
from env_pool.tool_env import ToolEnv


# The benchmark's own few-shot prompt, part of its definition and the same at every
# snapshot, in every run and in both interfaces: a request that lacks its quantity
# (ask first, then add), an add, a remove, a look at the list, a thank-you that needs
# no call, and a request dropped after the question. Without them SmolLM2-135M never
# calls a tool. The order decides the base rates, which must be above zero and well
# below the ceiling so that gains and losses both show (each order's measured rates:
# docs/main-job.md, the CPU default's worked exchanges). Their items (pear, yogurt) are
# never in a task, so they show the call format and the turn shapes, not an answer.
# Results are made up.
def _call_exchange(request: str, call: ToolCall, result: str, reply: str) -> Exchange:
    return (request, call, result, reply)


ASK_FIRST: tuple[Message, ...] = (
    {"role": "user", "content": "Please add some yogurt to my shopping list."},
    {"role": "assistant", "content": "How many yogurt would you like?"},
)
ASK_ANSWERED = _call_exchange(
    "3 of them, please.",
    ToolCall("add_item", {"item": "yogurt", "quantity": 3}),
    '{"added": "yogurt", "quantity": 3}',
    "I added 3 yogurt to your list.",
)
BENCHMARK_EXCHANGES: tuple[Exchange, ...] = (
    _call_exchange(
        "Please add pear to my shopping list, quantity 2.",
        ToolCall("add_item", {"item": "pear", "quantity": 2}),
        '{"added": "pear", "quantity": 2}',
        "I added 2 pear to your list.",
    ),
    _call_exchange(
        "Please remove yogurt from my shopping list.",
        ToolCall("remove_item", {"item": "yogurt"}),
        '{"removed": "yogurt", "items": {"pear": 2}}',
        "I removed yogurt from your list.",
    ),
    _call_exchange(
        "What is on my shopping list now?", ToolCall("view_list", {}), '{"items": {"pear": 2}}', "Your list has 2 pear."
    ),
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
    return (
        [dict(m) for m in ASK_FIRST]
        + exchange_messages([ASK_ANSWERED, *BENCHMARK_EXCHANGES], fmt, bare)
        + [dict(m) for m in (*NO_CALL_EXCHANGE, *ASK_DROPPED)]
    )


class ShoppingEnv(ToolEnv[ShoppingTask]):
    kind = "shopping"
    splits = SPLITS
    tools = TOOLS
    intro = "You are a shopping-list assistant with tools."
    after = (
        "After the tool answers, reply to the user in plain text. "
        "If the request needs no tool, or lacks a detail you need, reply in plain text."
    )
    example = ToolCall("add_item", {"item": "pear", "quantity": 2})

    def __init__(
        self,
        tool_format: str = "python",
        step_limit: int = 2,
        instance_mismatch: str = "release",
        max_context_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        bare_calls: bool = True,
    ) -> None:
        """``bare_calls``: the prompt shows a single python call without the list's brackets
        (``add_item(...)``, not ``[add_item(...)]``); either parses. SmolLM2-135M starts a bare
        call about 7x more often (docs/main-job.md: the CPU default)."""
        super().__init__(tool_format, step_limit, instance_mismatch, max_context_tokens, token_counter)
        self.bare_calls = bare_calls and tool_format == "python"

    @classmethod
    def task_of(cls, task_id: str) -> ShoppingTask:
        return get_task(task_id)

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        return render_calls(list(calls), self.tool_format, self.bare_calls)

    def new_state(self, task: ShoppingTask) -> ShoppingList:
        return ShoppingList(dict(task.initial))

    def open_episode(self, task: ShoppingTask) -> list[Message]:
        system, *first_turn = super().open_episode(task)
        # The benchmark's exchanges, whatever the interface: interface.worked_examples adds none here.
        # A further training-only exchange (a tool error read and the call repeated, before or
        # after these) cut the training interface's success at temperature 0.7 from 22% / 48%
        # (base / miss_param, 40 train tasks each) to 2% / 30% or 25% / 10%.
        return [system, *benchmark_messages(self.tool_format, self.bare_calls), *first_turn]

    def judge(self) -> Verdict:
        # An episode the step limit or the context cut off fails as force-terminated.
        return judge(self.task, self.parsed_turns, self.instance_mismatch, cut_off=self.outcome != Outcome.COMPLETED)
