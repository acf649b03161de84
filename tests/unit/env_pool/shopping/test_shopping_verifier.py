"""The built-in multi-turn shopping env: verifier, state checker and tags on scripted model outputs."""

from __future__ import annotations

import pytest

from env_pool import tags as T
from env_pool.base import play_scripted
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.shopping.env import ShoppingEnv
from env_pool.shopping.tasks import CATEGORIES, SPLITS, get_task
from env_pool.shopping.tools import TOOLS, ShoppingList
from env_pool.tool_calls import ToolCall, render_calls

TRAINING = InterfaceState(schema_lite=True, error_feedback=True, guidelines=True, worked_examples=True)


def _task_of(category: str, first_tool: str | None = None):
    for task_id in ShoppingEnv().task_ids("train"):
        task = get_task(task_id)
        tools = [c.name for t in task.turns for c in t.expected]
        if task.category == category and (first_tool is None or tools[0] == first_tool):
            return task
    raise AssertionError(f"no {category} task")


def _call(name: str, fmt: str = "python", **arguments) -> str:
    return render_calls([ToolCall(name, arguments)], fmt)


def _play(task, turns, fmt="python", interface=None, instance_mismatch="release"):
    return play_scripted(ShoppingEnv(tool_format=fmt, instance_mismatch=instance_mismatch), task.id, turns, interface)


@pytest.mark.parametrize("fmt,bare", [("json", False), ("python", False), ("python", True)])
def test_reference_agent_solves_every_task_and_tasks_are_deterministic(fmt, bare):
    env = ShoppingEnv(tool_format=fmt, bare_calls=bare)
    results = [play_scripted(env, t, env.reference_turns(t)) for t in env.task_ids("all")]
    assert len(results) == SPLITS.num_tasks and all(r.reward == 1 and r.progress == 1.0 for r in results)
    assert {r.category for r in results} == set(CATEGORIES)
    assert all(set(r.tags) <= {T.PASS, T.CORRECT_ABSTENTION} and 2 <= len(r.tags) <= 3 for r in results)
    assert not set(env.task_ids("train")) & set(env.task_ids("test"))
    assert get_task("shop_7") == get_task("shop_7")


def test_state_checker_fails_a_wrong_end_state_and_tags_it():
    task = _task_of("base", "add_item")
    add = task.turns[0].expected[0].arguments
    wrong = _play(task, [[_call("add_item", item=add["item"], quantity=add["quantity"] + 1), "Done."], ["ok"]])
    assert (wrong.reward, wrong.error_type) == (0, T.ERR_STATE)
    assert (wrong.tags[0], wrong.labels[0]) == (T.STATE_MISMATCH, T.ARGUMENT_MISMATCH)
    silent = _play(task, [["Sure, done."], ["ok"]])
    assert (silent.reward, silent.tags[0], silent.labels[0], silent.error_type) == (
        0,
        T.EMPTY_TURN,
        T.MISSING_TOOL_CALL,
        T.ERR_EMPTY_TURN,
    )


def test_response_checker_needs_the_list_the_user_asked_for():
    task = next(
        get_task(t)
        for t in ShoppingEnv().task_ids("train")
        if get_task(t).category == "base" and get_task(t).turns[-1].expected and "milk" not in dict(get_task(t).initial)
    )
    first = render_calls(list(task.turns[0].expected), "python")
    # The right end state, but the list the user asked to see was never read.
    unread = _play(
        task, [[first, "Done."], [_call("add_item", item="milk", quantity=1), _call("remove_item", item="milk"), "ok"]]
    )
    seen = _play(task, [[first, "Done."], [_call("view_list"), "Here it is."]])
    assert seen.reward == 1 and seen.tags == [T.PASS, T.PASS]
    assert (unread.reward, unread.tags[-1], unread.error_type) == (0, T.RESPONSE_MISMATCH, T.ERR_RESPONSE)


def test_tool_error_and_recovery_within_a_turn():
    task = _task_of("recovery")
    add = task.turns[0].expected[0].arguments
    plural = _call("add_item", item=add["item"] + "s", quantity=add["quantity"])
    right = _call("add_item", item=add["item"], quantity=add["quantity"])
    closing = [render_calls(list(task.turns[1].expected), "python")] if task.turns[1].expected else []
    recovered = _play(task, [[plural, right, "Added."], closing + ["ok"]], interface=TRAINING)
    assert recovered.reward == 1 and recovered.tags[0] == T.PASS and recovered.num_tool_calls >= 2
    stuck = _play(task, [[plural, "Sorry."], closing + ["ok"]])
    assert (stuck.reward, stuck.tags[0], stuck.labels[0]) == (0, T.STATE_MISMATCH, T.ARGUMENT_MISMATCH)
    env = ShoppingEnv()
    env.reset(task.id, TRAINING)
    reply = env.step(plural).messages[0]["content"]
    assert '"error"' in reply and "singular" in reply and "Hint:" in reply  # error feedback adds its hint
    env.reset(task.id, RAW_INTERFACE)
    assert "Hint:" not in env.step(plural).messages[0]["content"]


def test_turns_that_expect_no_call():
    task = _task_of("miss_param")
    add = task.turns[1].expected[0].arguments
    closing = [render_calls(list(task.turns[2].expected), "python")] if task.turns[2].expected else []
    asked = _play(task, [["How many would you like?"], [_call("add_item", **add), "Added."], closing + ["ok"]])
    assert asked.reward == 1 and asked.tags[0] == T.CORRECT_ABSTENTION and asked.labels[0] == T.PASS
    # Guessing the missing quantity: a spurious call, and the list ends wrong at the next check.
    guessed = _play(
        task,
        [
            [_call("add_item", item=add["item"], quantity=1), "Added."],
            [_call("add_item", **add), "ok"],
            closing + ["ok"],
        ],
    )
    assert (guessed.tags[:2], guessed.labels[0]) == ([T.SPURIOUS_TOOL_CALL, T.STATE_MISMATCH], T.INVALID_TOOL_CALL)
    assert guessed.reward == 0 and guessed.progress < 1


def test_parse_errors_unknown_tools_and_the_instance_rule():
    task = _task_of("base", "add_item")
    garbled = _play(task, [["[add_item(item='milk'"], ["ok"]], interface=TRAINING)
    assert garbled.num_parse_errors == 1 and garbled.labels[0] == T.INVALID_TOOL_CALL
    made_up = [[_call("buy", item="milk"), "ok"], ["ok"]]
    assert _play(task, made_up).tags[0] == T.STATE_MISMATCH
    assert _play(task, made_up, instance_mismatch="classes").tags[0] == T.INSTANCE_MISMATCH
    with pytest.raises(ValueError, match="diagnosis.instance_mismatch"):
        ShoppingEnv(instance_mismatch="scope")


def test_step_limit_cuts_the_episode_off():
    task = _task_of("base", "add_item")
    env = ShoppingEnv(step_limit=1)
    env.reset(task.id)
    assert not env.step(_call("view_list")).done
    assert env.step(_call("view_list")).done
    result = env.result()
    assert (result.outcome, result.reward, result.error_type) == ("step_limit", 0, T.ERR_FORCE_TERMINATED)
    with pytest.raises(KeyError, match="unknown shopping task"):
        get_task("shop_480")
    with pytest.raises(ValueError, match="unknown split"):
        env.task_ids("dev")


def test_the_benchmark_exchanges_are_in_every_interface_and_reveal_no_task():
    env = ShoppingEnv()
    raw = env.reset("shop_4")
    exchange_roles = (
        ["user", "assistant"]
        + ["user", "assistant", "tool", "assistant"] * 4
        + ["user", "assistant"]
        + ["user", "assistant"] * 2
    )
    assert [m["role"] for m in raw] == ["system"] + exchange_roles + ["user"]
    trained = env.reset("shop_4", TRAINING)
    assert trained[1:] == raw[1:]  # the training interface changes the system prompt (annotations), not the turns
    shown = " ".join(m["content"] for m in trained[1:-1])
    for task_id in env.task_ids("all"):
        for turn in get_task(task_id).turns:
            for call in turn.expected:
                if "item" in call.arguments:
                    assert f"'{call.arguments['item']}'" not in shown and f'"{call.arguments["item"]}"' not in shown
    assert "[required]" in trained[0]["content"] and "[required]" not in raw[0]["content"]


def test_shopping_list_executor():
    items = ShoppingList({"milk": 1})
    assert '"quantity": 3' in TOOLS.execute(ToolCall("add_item", {"item": "milk", "quantity": 2}), items)
    assert "error" in TOOLS.execute(ToolCall("add_item", {"item": "milk", "quantity": 99}), items)
    assert "missing required argument 'quantity'" in TOOLS.execute(ToolCall("add_item", {"item": "egg"}), items)
    assert "no such item" in TOOLS.execute(ToolCall("remove_item", {"item": "egg"}), items)
    TOOLS.execute(ToolCall("remove_item", {"item": "milk"}), items)
    assert items.snapshot() == {}


def test_the_prompt_shows_bare_calls_unless_told_otherwise():
    """The python format's calls are shown bare by default (the embedded model starts one far
    more often); the bracketed list still parses, so both play the same."""
    bare, listed = ShoppingEnv(), ShoppingEnv(bare_calls=False)
    shown = [m["content"] for m in bare.reset("shop_0", TRAINING) if m["role"] == "assistant"]
    assert "add_item(item='pear', quantity=2)" in shown and not any(c.startswith("[") for c in shown)
    assert "\nadd_item(item='pear', quantity=2)\n" in bare.system_prompt(TRAINING)
    assert "[add_item(item='pear', quantity=2)]" in listed.system_prompt(TRAINING)
    task = _task_of("base", "add_item")
    for env in (bare, listed):
        first = _call(task.turns[0].expected[0].name, **task.turns[0].expected[0].arguments)
        turns = [[first, "Done."]] + [
            [_call(c.name, **c.arguments) for c in t.expected] + ["Done."] for t in task.turns[1:]
        ]
        assert play_scripted(env, task.id, turns).reward == 1
        assert play_scripted(env, task.id, [[first[1:-1], "Done."]] + turns[1:]).reward == 1
