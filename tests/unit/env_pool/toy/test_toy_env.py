"""The built-in small tool environment: exact verifier, same episode API."""

from __future__ import annotations

import pytest

from env_pool import tags as T
from env_pool.base import play_scripted
from env_pool.interface.state import InterfaceState
from env_pool.tool_calls import ToolCall, render_calls
from env_pool.toy.env import SPLITS, ToyToolEnv, toy_task


@pytest.mark.parametrize("fmt", ["json", "python"])
def test_reference_agent_solves_every_task(fmt):
    env = ToyToolEnv(tool_format=fmt)
    results = [play_scripted(env, t, env.reference_turns(t)) for t in env.task_ids("all")]
    assert len(results) == SPLITS.num_tasks and all(r.reward == 1 and r.tags == [T.PASS] for r in results)
    assert len(env.task_ids("train")) + len(env.task_ids("test")) == SPLITS.num_tasks


def _play(text: str, task_id: str = "toy_0", interface=None, instance_mismatch: str = "release"):
    env = ToyToolEnv(tool_format="json", instance_mismatch=instance_mismatch)
    return play_scripted(env, task_id, [[text, "ok"]], interface), env


def test_verifier_outcomes_and_tags():
    task = toy_task("toy_0")
    a, b = task.expected.arguments["a"], task.expected.arguments["b"]
    assert _play(render_calls([ToolCall("add", {"a": b, "b": a})], "json"))[0].reward == 1  # commutative
    wrong = _play(render_calls([ToolCall("add", {"a": a + 1, "b": b})], "json"))[0]
    assert (wrong.reward, wrong.tags, wrong.labels) == (0, [T.RESPONSE_MISMATCH], [T.ARGUMENT_MISMATCH])
    other = render_calls([ToolCall("multiply", {"a": a, "b": b})], "json")  # the wrong tool
    assert (_play(other)[0].reward, _play(other)[0].tags) == (0, [T.RESPONSE_MISMATCH])  # release: no such tag
    assert _play(other, instance_mismatch="classes")[0].tags == [T.INSTANCE_MISMATCH]
    with pytest.raises(ValueError, match="diagnosis.instance_mismatch"):
        ToyToolEnv(instance_mismatch="nope")
    extra = _play(render_calls([task.expected, ToolCall("get_weather", {"city": "Oslo"})], "json"))[0]
    assert extra.reward == 0
    silent = _play("It is 42.")[0]
    assert (silent.tags, silent.labels) == ([T.EMPTY_TURN], [T.MISSING_TOOL_CALL])
    garbled = _play("<tool_call>{oops</tool_call>")[0]
    assert garbled.labels == [T.INVALID_TOOL_CALL] and garbled.num_parse_errors == 1


def test_tool_results_and_feedback():
    env = ToyToolEnv(tool_format="json")
    env.reset("toy_0", InterfaceState(error_feedback=True, schema_lite=True))
    assert "[required]" in env.messages[0]["content"]
    r = env.step(render_calls([ToolCall("add", {"a": "x", "b": 2})], "json"))
    assert '"error"' in r.messages[0]["content"] and "Hint:" in r.messages[0]["content"]
    r = env.step(render_calls([ToolCall("divide", {"a": 1})], "json"))
    assert "not an available tool" in r.messages[0]["content"]


def test_step_limit_and_bad_ids():
    env = ToyToolEnv(tool_format="json", step_limit=1)
    env.reset("toy_3")
    assert not env.step(render_calls([ToolCall("add", {"a": 1, "b": 1})], "json")).done
    assert env.step(render_calls([ToolCall("add", {"a": 1, "b": 1})], "json")).done
    assert env.result().outcome == "step_limit"
    with pytest.raises(KeyError, match="unknown toy task"):
        toy_task("toy_999")
    with pytest.raises(ValueError, match="unknown split"):
        env.task_ids("dev")


def test_opening_shows_worked_exchanges_in_the_active_format():
    env = ToyToolEnv(tool_format="python")
    msgs = env.reset("toy_5")
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant", "tool", "assistant"] * 3 + ["user"]
    assert msgs[2]["content"] == "[add(a=3, b=4)]" and msgs[-1]["content"] == toy_task("toy_5").question
    assert [m["role"] for m in ToyToolEnv(few_shot=False).reset("toy_5")] == ["system", "user"]
