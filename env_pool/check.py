"""The checks `seal train` runs on an environment before a run, for a user's own pytest:

    from env_pool.check import check_env
    from my_env import MyEnv

    def test_my_env_keeps_the_contract():
        check_env(MyEnv(), task_ids=["my_0", "my_7"])

Each failure is env_pool.contract's one line naming the environment and the method (EnvContractError).
"""

from __future__ import annotations

from collections.abc import Sequence

from env_pool.base import Environment
from env_pool.contract import check_env_class, check_episode
from env_pool.registry import ENVIRONMENTS, category_of, environments


def check_env(env: Environment, task_ids: Sequence[str] | None = None) -> None:
    """The class (methods, ``kind``, ``task_prefix``, ``category_of``, ``success_threshold``), then each
    task played as preflight plays one: a correct agent, one that never calls a tool, a partial answer
    (None: the first training task, the one `seal train` plays)."""
    check_env_class(type(env), environments(), ENVIRONMENTS)
    for task_id in task_ids if task_ids is not None else env.task_ids("train")[:1]:
        check_episode(env, task_id, category_of(task_id))
