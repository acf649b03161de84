"""env_pool.registry: each environment package owns its task-id prefix and categories."""

from __future__ import annotations

import pytest

from env_pool.bfcl.env import BfclEnv
from env_pool.registry import ENVIRONMENTS, category_of, env_kind
from env_pool.shopping.env import ShoppingEnv
from env_pool.shopping.tasks import get_task
from env_pool.toy.env import ToyToolEnv, toy_task


def test_every_env_kind_is_listed_with_its_own_categories():
    assert set(ENVIRONMENTS) == {BfclEnv.kind, ShoppingEnv.kind, ToyToolEnv.kind}
    assert category_of("multi_turn_miss_func_12") == "miss_func" and env_kind("multi_turn_base_0") == "bfcl"
    assert [category_of(t) for t in ShoppingEnv().task_ids("test")] == [
        get_task(t).category for t in ShoppingEnv().task_ids("test")
    ]
    assert [category_of(t) for t in ToyToolEnv().task_ids("all")] == [
        toy_task(t).category for t in ToyToolEnv().task_ids("all")
    ]
    assert {env_kind("shop_3"), env_kind("toy_3")} == {"shopping", "toy"}


@pytest.mark.parametrize(
    "task_id, match",
    [
        ("tau2_retail/0", "no environment has task id"),
        ("multi_turn_nope_1", "not a BFCL"),
        ("shop_480", "unknown shopping task"),
        ("toy_x", "unknown toy task"),
    ],
)
def test_unknown_ids_are_a_key_error(task_id, match):
    with pytest.raises(KeyError, match=match):
        category_of(task_id)
