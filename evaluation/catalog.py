"""Every view `seal evaluate` can build, by name: the in-distribution views
(evaluation/views.py: validation, id, ood, replay) and the offline OOD harness
views (evaluation/ood_views.py: tau2_*, bfcl_memory_*), joined here so that
neither registry imports the other.

A further view plugs in through ``register_view`` (in a module `seal evaluate`
imports): a builder gets a ``ViewContext`` and returns a ``View``, e.g. with
role "ood" and its own env config. ``task_category`` knows every task id a view
may hold: a harness task's domain or backend, else its environment's category.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from env_pool.registry import category_of
from evaluation.ood_views import OOD_VIEWS, harness_category, is_harness_task
from evaluation.view_base import View, ViewBuilder, ViewContext, by_category, register_in, round_robin
from evaluation.views import ID_VIEWS

VIEW_BUILDERS: dict[str, ViewBuilder] = {}


def register_view(name: str) -> Callable[[ViewBuilder], ViewBuilder]:
    return register_in(VIEW_BUILDERS, name)


for _registry in (ID_VIEWS, OOD_VIEWS):
    for _name, _builder in _registry.items():
        register_view(_name)(_builder)


def task_category(task_id: str) -> str:
    """The category of any task a view may hold; KeyError for an id neither a harness nor an environment knows."""
    return harness_category(task_id) if is_harness_task(task_id) else category_of(task_id)


def stratified_head(ids: Sequence[str], k: int | None) -> list[str]:
    """The first k ids taking categories in turn (BFCL splits list one category
    after another, so a plain head would test one category only). Keeps the
    input order; k None or >= len returns everything."""
    if k is None or k >= len(ids):
        return list(ids)
    keep = round_robin(list(by_category(ids, task_category).values()), k)
    return [t for t in ids if t in keep]


def build_views(names: Sequence[str], ctx: ViewContext) -> list[View]:
    """Views by name, in the order given, each cut to its limit (stratified)."""
    unknown = [n for n in names if n not in VIEW_BUILDERS]
    if unknown:
        raise ValueError(f"unknown views {unknown}; registered: {sorted(VIEW_BUILDERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a view is named twice in {list(names)}")
    views = []
    for name in names:
        view = VIEW_BUILDERS[name](ctx)
        if view.name != name:
            raise ValueError(f"view builder {name!r} returned a view named {view.name!r}")
        if view.unavailable is None:
            view = View(
                view.name, view.role, tuple(stratified_head(view.task_ids, ctx.config.limit_for(name))), view.env
            )
        views.append(view)
    return views
