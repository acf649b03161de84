"""The one step loop (env_pool/multi_turn.py): every env runs it, and its per-turn step limit is
bfcl-eval's boundary (``step_limit`` steps that do not end a turn; the one past them ends the
episode), so the copies that drifted apart (``>`` in one env, ``>=`` in another) cannot return."""

from __future__ import annotations

import pytest

from env_pool.base import Outcome
from env_pool.bfcl.env import BfclEnv
from env_pool.interface.state import InterfaceState
from env_pool.multi_turn import MultiTurnEnv
from env_pool.shopping.env import ShoppingEnv
from env_pool.shopping.tasks import get_task
from env_pool.tool_calls import ToolCall, render_calls
from env_pool.toy.env import ToyToolEnv

ADD = render_calls([ToolCall("add", {"a": 1, "b": 1})], "json")
VIEW = render_calls([ToolCall("view_list", {})], "python")


@pytest.mark.parametrize("env_class", [BfclEnv, ShoppingEnv, ToyToolEnv])
def test_every_env_runs_the_shared_loop(env_class):
    assert issubclass(env_class, MultiTurnEnv)
    for name in ("reset", "step", "end", "result", "_check_context", "_finish"):
        assert name not in vars(env_class), f"{env_class.__name__} overrides {name}: the loop lives in MultiTurnEnv"


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_a_turn_may_take_step_limit_steps_and_the_next_one_ends_the_episode(limit):
    env = ToyToolEnv(tool_format="json", step_limit=limit)
    env.reset("toy_0")
    for _ in range(limit):
        r = env.step(ADD)
        assert not r.done and not r.turn_ended and r.outcome is None
    r = env.step(ADD)  # one past the limit: its call still runs (as bfcl-eval), then the episode ends
    assert r.done and r.outcome == Outcome.STEP_LIMIT and r.num_calls == 1 and len(r.messages) == 1
    res = env.result()
    assert (res.outcome, res.num_steps, res.num_tool_calls) == ("step_limit", limit + 1, limit + 1)
    assert env.stats.outcomes == {"step_limit": 1}


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_turn_at_the_limit_can_still_end_with_its_answer(limit):
    env = ToyToolEnv(tool_format="json", step_limit=limit)
    env.reset("toy_0")
    for _ in range(limit):
        assert not env.step(ADD).done
    r = env.step("The answer is 2.")
    assert r.done and r.turn_ended and r.outcome == Outcome.COMPLETED


def test_hinted_parse_errors_count_toward_the_limit_and_raw_ones_end_the_turn():
    train = ToyToolEnv(tool_format="json", step_limit=1)
    train.reset("toy_0", InterfaceState(error_feedback=True))
    assert not train.step("<tool_call>{oops</tool_call>").done
    assert train.step("<tool_call>{oops</tool_call>").outcome == Outcome.STEP_LIMIT
    raw = ToyToolEnv(tool_format="json", step_limit=1)
    raw.reset("toy_0")
    r = raw.step("<tool_call>{oops</tool_call>")
    assert r.turn_ended and r.outcome == Outcome.COMPLETED and r.parse_error


def test_the_count_starts_again_each_user_turn():
    task_id = next(t for t in ShoppingEnv().task_ids("train") if get_task(t).num_turns == 3)
    env = ShoppingEnv(step_limit=1)
    env.reset(task_id)
    for turn in range(2):
        assert not env.step(VIEW).done
        r = env.step("Done.")
        assert r.turn_ended and not r.done and r.turn_index == turn and r.messages[-1]["role"] == "user"
    assert not env.step(VIEW).done
    assert env.step(VIEW).outcome == Outcome.STEP_LIMIT
    assert env.result().outcome == "step_limit"


@pytest.mark.parametrize("env_class", [ShoppingEnv, ToyToolEnv])
def test_a_bad_step_limit_is_refused(env_class):
    with pytest.raises(ValueError, match="step_limit must be >= 1"):
        env_class(step_limit=0)
