"""Ground truth through our env, verifier and diagnosis: all 800 tasks pass."""

from __future__ import annotations

from collections import Counter

import pytest

from env_pool.base import play_scripted
from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.tasks import CATEGORIES, get_task, split_ids
from env_pool.interface.state import RAW_INTERFACE, InterfaceState

TRAINING = InterfaceState(schema_lite=True, error_feedback=True, guidelines=True, active_guidelines=("state_aware",))


@pytest.mark.parametrize("fmt, interface", [("json", RAW_INTERFACE), ("python", TRAINING)])
def test_every_ground_truth_earns_reward_1(fmt, interface):
    env = BfclEnv(tool_format=fmt)
    tags: Counter = Counter()
    failed = []
    for task_id in split_ids("all"):
        result = play_scripted(env, task_id, env.reference_turns(task_id), interface)
        tags.update(result.tags)
        if result.reward != 1 or result.progress != 1.0:
            failed.append((task_id, result.error_type, result.tags))
    assert not failed, failed[:5]
    assert set(tags) == {"pass", "correct_abstention"}
    assert env.stats.episodes == 800 and env.stats.outcomes == {"completed": 800}
    assert env.stats.tool_calls == 4625  # every ground-truth call, executed once


def test_split_is_the_published_400_400():
    train, test = split_ids("train"), split_ids("test")
    assert len(train) == len(test) == 400 and not set(train) & set(test)
    for ids in (train, test):
        assert Counter(get_task(i).category for i in ids) == {c: 100 for c in CATEGORIES}
    assert len(split_ids("all")) == 800


def test_miss_func_withholds_then_reveals_the_function():
    task = get_task("multi_turn_miss_func_0")
    ((turn, docs),) = task.withheld.items()
    names0 = {d["name"] for d in task.tools_at_turn(0)}
    assert docs[0]["name"] not in names0
    assert docs[0]["name"] in {d["name"] for d in task.tools_at_turn(turn)}
    assert task.questions[turn] == () and task.ground_truth[turn - 1] == ()
    env = BfclEnv()
    env.reset(task.id)
    reveal = env.user_messages(turn)[0]["content"]
    assert docs[0]["name"] in reveal and "I have updated some more functions" in reveal


def test_unknown_task_id_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown BFCL task id"):
        get_task("multi_turn_base_9999")
