"""What every view registry shares: the ``View`` a builder returns, the
``ViewContext`` it reads, the registering decorator and the round-robin
selection over categories. The registries themselves are evaluation/views.py
(in-distribution) and evaluation/ood_views.py (offline OOD harnesses);
evaluation/catalog.py joins them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evaluation.config import EvalConfig


@dataclass(frozen=True)
class View:
    name: str
    role: str  # validation | id | ood | replay: which metric the view feeds
    task_ids: tuple[str, ...] = ()
    env: Mapping[str, Any] | None = None  # an env config (hydra node as a dict); None: the run's env
    unavailable: str | None = None  # why the view cannot be run (then it has no tasks)


@dataclass
class ViewContext:
    """What a view builder may read. ``training_pool`` is a callable: the real
    pool needs the run's tokenizer (training skips overlong tasks), so it is
    computed once, by the caller, only when asked for."""

    config: EvalConfig
    split_ids: Callable[[str], Sequence[str]]  # the run env's task ids of a split
    training_pool: Callable[[], Sequence[str]]  # the tasks the run's stream cycles over, in slot order
    trained_groups: int  # groups the learner consumed by the last snapshot (steps x groups_per_step)


ViewBuilder = Callable[[ViewContext], View]


def register_in(registry: dict[str, ViewBuilder], name: str) -> Callable[[ViewBuilder], ViewBuilder]:
    """A decorator adding a builder to ``registry`` under ``name``; a name is registered once."""

    def add(builder: ViewBuilder) -> ViewBuilder:
        if name in registry:
            raise ValueError(f"view {name!r} is registered twice")
        registry[name] = builder
        return builder

    return add


def by_category(ids: Sequence[str], category: Callable[[str], str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for t in ids:
        groups.setdefault(category(t), []).append(t)
    return groups


def round_robin(groups: Sequence[Sequence[str]], k: int) -> set[str]:
    """Up to k ids, one from each group in turn, from the head of each group."""
    taken: set[str] = set()
    depth = 0
    while len(taken) < k and any(depth < len(g) for g in groups):
        for g in groups:
            if depth < len(g) and len(taken) < k:
                taken.add(g[depth])
        depth += 1
    return taken
