"""Which environment a task id belongs to, and the task's category, without building an environment.

Task ids carry their environment in a prefix. Each environment package owns its
prefix and its categories (``TASK_PREFIX`` and ``category_of`` beside its tasks);
this table only lists them, by the env class's ``kind``. The modules are light:
no task data or bfcl-eval loads until a category needs it.
"""

from __future__ import annotations

from collections.abc import Callable

from env_pool.bfcl import tasks as bfcl_tasks
from env_pool.shopping import tasks as shopping_tasks
from env_pool.toy import env as toy_env

# kind -> (task-id prefix, category_of)
ENVIRONMENTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "bfcl": (bfcl_tasks.TASK_PREFIX, bfcl_tasks.category_of),
    "shopping": (shopping_tasks.TASK_PREFIX, shopping_tasks.category_of),
    "toy": (toy_env.TASK_PREFIX, toy_env.category_of),
}


def env_kind(task_id: str) -> str:
    """The ``kind`` of the environment whose task ids look like ``task_id``; KeyError if none does."""
    for kind, (prefix, _) in ENVIRONMENTS.items():
        if task_id.startswith(prefix):
            return kind
    prefixes = ", ".join(prefix for prefix, _ in ENVIRONMENTS.values())
    raise KeyError(f"no environment has task id {task_id!r} (task ids start with {prefixes})")


def category_of(task_id: str) -> str:
    """The task's category as its environment defines it; KeyError for an id no environment knows."""
    return ENVIRONMENTS[env_kind(task_id)][1](task_id)
