"""ToolEnv (env_pool/tool_env.py) and the public hooks of the step loop (env_pool/multi_turn.py): an
environment of a few declarations keeps the contract, reads its episode through typed accessors, and
one still written with the old private hook names works for one more release, with one line each."""

from __future__ import annotations

import random
import warnings

import pytest

from env_pool.base import EpisodeStateError, play_scripted
from env_pool.contract import check_episode
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import RENAMED_HOOKS, MultiTurnEnv
from env_pool.registry import ENVIRONMENTS, category_of, environments
from env_pool.tasks import IndexedSplits, Turn, TurnTask
from env_pool.tool_calls import ToolCall
from env_pool.tool_env import ToolEnv
from env_pool.tool_functions import ToolSet
from examples.thermostat.env import ThermostatEnv


def double(n: int) -> int:
    """Twice a number.

    n: The number.
    """
    return 2 * n


class Doubling(ToolEnv[TurnTask]):
    kind = "doubling"
    splits = IndexedSplits("dbl_", num_train=8, num_tasks=10)
    tools = ToolSet(double)
    intro = "You double numbers."

    @classmethod
    def task_of(cls, task_id: str) -> TurnTask:
        n = random.Random(cls.splits.index(task_id)).randint(2, 50)
        turn = Turn(f"What is twice {n}?", (ToolCall("double", {"n": n}),), reply=str(2 * n))
        return TurnTask(task_id, "small" if n < 25 else "large", (turn,))

    def judge(self) -> float:
        n = self.task.turns[0].expected[0].arguments["n"]
        return 1.0 if str(2 * n) in self.turn_texts[-1][-1] else 0.0


def test_a_tool_env_of_a_few_declarations_keeps_the_contract():
    from env_pool.contract import check_env_class

    check_env_class(Doubling, environments(), ENVIRONMENTS)
    assert Doubling.task_prefix == "dbl_" and category_of("dbl_0") == Doubling.category_of("dbl_0")
    env = Doubling()
    assert env.task_ids("test") == ["dbl_8", "dbl_9"]
    check_episode(env, "dbl_0", Doubling.category_of("dbl_0"))
    system, user = env.reset("dbl_0")
    assert system["content"].startswith("You double numbers. To use a tool, reply with only the call, for example:\n")
    assert '{"name": "double", "description": "Twice a number."' in system["content"] and user["role"] == "user"


def test_the_episode_is_read_through_typed_accessors():
    env = Doubling()
    with pytest.raises(EpisodeStateError, match="Doubling.task: no episode yet; call reset"):
        _ = env.task
    env.reset("dbl_1", InterfaceState(error_feedback=True))
    n = env.task.turns[0].expected[0].arguments["n"]
    step = env.step(f"[double(n={n})]")
    assert step.messages[0]["content"] == str(2 * n) and env.parsed_turns[0][0].calls[0].name == "double"
    hinted = env.step("[triple(n=1)]").messages[0]["content"]  # an unknown tool: the error, then the hint
    assert hinted.startswith('{"error": "unknown tool \'triple\'"}\n') and "double" in hinted.splitlines()[1]
    env.step(f"It is {2 * n}.")
    assert env.turn_texts == [[f"[double(n={n})]", "[triple(n=1)]", f"It is {2 * n}."]]
    assert env.outcome is not None and env.outcome.value == "completed" and env.result().reward == 1.0


def test_the_old_private_hook_names_work_with_one_warning_line_each():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class Legacy(MultiTurnEnv):
            kind = "legacy"

            def task_ids(self, split="all"):
                return Doubling().task_ids(split)

            def reference_turns(self, task_id):
                return Doubling().reference_turns(task_id)

            def user_messages(self, turn):
                return [{"role": "user", "content": self._task.turns[turn].user}]

            def _load(self, task_id):
                return Doubling.task_of(task_id)

            def _open(self, task):
                return self.user_messages(0)

            def _signatures(self):
                return Doubling.tools.signatures

            def _tool_names(self, turn):
                return ["double"]

            def _execute(self, call, turn):
                return Doubling.tools.execute(call)

            def _judge(self):
                return 1.0 if len(self._turn_texts[0]) == 2 else 0.0

    lines = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert lines == [
        f"{__name__}.{Legacy.__qualname__}.{old} is the old name of the hook {new}: rename it "
        "(the old name works until the next release; docs/custom-environment.md)"
        for old, new in RENAMED_HOOKS
        if old != "_release"
    ]
    result = play_scripted(Legacy(tool_format="python", step_limit=2), "dbl_3", Doubling().reference_turns("dbl_3"))
    assert result.reward == 1.0 and result.tags == ["unknown"]


def test_an_old_override_of_a_renamed_hook_still_reaches_the_parents_by_super():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)

        class Stricter(ThermostatEnv):
            def _judge(self):
                return super()._judge().progress / 2

    env = Stricter()
    assert play_scripted(env, "thermo_0", env.reference_turns("thermo_0")).reward == 0.5
