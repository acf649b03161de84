"""Which environment a task id belongs to, and the task's category, without building an environment.

Task ids carry their environment in a prefix. Each environment package owns its
prefix and its categories (``TASK_PREFIX`` and ``category_of`` beside its tasks);
this table only lists them, by the env class's ``kind``. The modules are light:
no task data or bfcl-eval loads until a category needs it.

An environment from outside env_pool (docs/custom-environment.md) is found by type: every
imported subclass of ``Environment`` that sets ``task_prefix`` joins the table under its
``kind``. Its module is imported wherever its config is built, before any of its task ids
is looked up.
"""

from __future__ import annotations

from collections.abc import Callable

from env_pool.base import Environment
from env_pool.bfcl import tasks as bfcl_tasks
from env_pool.shopping import tasks as shopping_tasks
from env_pool.toy import env as toy_env

# kind -> (task-id prefix, category_of)
ENVIRONMENTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "bfcl": (bfcl_tasks.TASK_PREFIX, bfcl_tasks.category_of),
    "shopping": (shopping_tasks.TASK_PREFIX, shopping_tasks.category_of),
    "toy": (toy_env.TASK_PREFIX, toy_env.category_of),
}


def environments() -> dict[str, tuple[str, Callable[[str], str]]]:
    """The built-in table and every imported ``Environment`` subclass that sets a ``task_prefix``."""
    table = dict(ENVIRONMENTS)
    pending = list(Environment.__subclasses__())
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls.task_prefix and cls.kind not in ENVIRONMENTS:
            table[cls.kind] = (cls.task_prefix, cls.category_of)
    return table


def env_kind(task_id: str) -> str:
    """The ``kind`` of the environment whose task ids look like ``task_id``; KeyError if none does."""
    table = environments()
    for kind, (prefix, _) in table.items():
        if task_id.startswith(prefix):
            return kind
    prefixes = ", ".join(prefix for prefix, _ in table.values())
    raise KeyError(f"no environment has task id {task_id!r} (task ids start with {prefixes})")


def category_of(task_id: str) -> str:
    """The task's category as its environment defines it; KeyError for an id no environment knows."""
    return environments()[env_kind(task_id)][1](task_id)
