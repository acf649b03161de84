"""The offline OOD harnesses (env_pool/ood) as `seal evaluate` views.

Each view of ``env_pool.ood.AVAILABLE_VIEWS`` (tau2_retail, tau2_airline,
tau2_telecom, bfcl_memory_kv, bfcl_memory_rec_sum) is registered in
``OOD_VIEWS`` with role "ood"; each of ``UNAVAILABLE_VIEWS`` (they need the
network) is registered too, and always builds as unavailable with its reason,
so asking for one says why instead of "unknown view". evaluation/catalog.py
joins this registry with the in-distribution one (evaluation/views.py).

Task ids carry their view so the split and limit logic stays pure:
``tau2_<domain>/<tau2 task id>`` and bfcl-eval's own memory question ids
(``memory_kv_0-customer-0``); the category of a task is its tau2 domain or
its memory backend. A harness view's ``env`` is not an env to instantiate:
it names the harness (``ood_harness``) and its settings, and it goes into the
result cache key like any env config. evaluation/ood_runner.py runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from env_pool.ood import (
    AVAILABLE_VIEWS,
    MEMORY_LABEL,
    TAU2_SIMULATOR_NOTE,
    UNAVAILABLE_VIEWS,
    VIEW_TARGETS,
    bfcl_memory,
    tau2,
)
from evaluation.records import OOD_TEST
from evaluation.view_base import View, ViewBuilder, ViewContext, register_in

HARNESS_KEY = "ood_harness"
TAU2_PREFIX = "tau2_"
MEMORY_PREFIX = "memory_"
TAU2_MAX_STEPS = 100  # tau2's orchestrator defaults (run_episode's)
TAU2_MAX_ERRORS = 10
# Agent and user simulator are the same engine: the evaluated snapshot.
USER_SIMULATOR = "the evaluated snapshot's own model (agent and user simulator share one VllmGenerator)"
_MODULES = {"tau2": "env_pool.ood.tau2", "bfcl_memory": "env_pool.ood.bfcl_memory"}
OOD_VIEWS: dict[str, ViewBuilder] = {}


def tau2_task_id(domain: str, task_id: str) -> str:
    return f"{TAU2_PREFIX}{domain}/{task_id}"


def split_tau2_id(task_id: str) -> tuple[str, str]:
    """``tau2_retail/12`` -> ("retail", "12")."""
    head, sep, tail = task_id.partition("/")
    if not sep or not head.startswith(TAU2_PREFIX) or not tail:
        raise ValueError(f"not a tau2 view task id: {task_id!r} (expected tau2_<domain>/<id>)")
    return head[len(TAU2_PREFIX) :], tail


def memory_backend(task_id: str) -> str:
    """``memory_rec_sum_3-customer-1`` -> "rec_sum" (bfcl-eval's question ids)."""
    rest = task_id[len(MEMORY_PREFIX) :] if task_id.startswith(MEMORY_PREFIX) else ""
    for backend in sorted((b for h, b in VIEW_TARGETS.values() if h == "bfcl_memory"), key=len, reverse=True):
        if rest.startswith(backend + "_"):
            return backend
    raise ValueError(f"not a BFCL memory question id: {task_id!r}")


def is_harness_task(task_id: str) -> bool:
    """Whether ``task_id`` has a harness view's id shape (its category is then ``harness_category``'s)."""
    return task_id.startswith((TAU2_PREFIX, MEMORY_PREFIX))


def harness_category(task_id: str) -> str:
    """A harness task's tau2 domain or memory backend; a KeyError (evaluation.catalog.task_category's
    contract) for an id no harness view holds."""
    try:
        return split_tau2_id(task_id)[0] if task_id.startswith(TAU2_PREFIX) else memory_backend(task_id)
    except ValueError as exc:
        raise KeyError(f"no category rule for task id {task_id!r}: {exc}") from None


def harness_env(view: str) -> dict[str, Any]:
    """The settings that decide a harness view's results (cache key material)."""
    harness, target = VIEW_TARGETS[view]
    env: dict[str, Any] = {"_target_": _MODULES[harness], HARNESS_KEY: harness, "view": view}
    if harness == "tau2":
        env.update(domain=target, max_steps=TAU2_MAX_STEPS, max_errors=TAU2_MAX_ERRORS, user_simulator="snapshot")
    else:
        env.update(backend=target, max_steps=None)  # None: bfcl-eval's own step limit
    return env


def is_harness(env: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    return env is not None and HARNESS_KEY in env


def view_task_ids(view: str) -> list[str]:
    """Every task of a harness view, in the harness's own order."""
    harness, target = VIEW_TARGETS[view]
    if harness == "tau2":
        return [tau2_task_id(target, t) for t in tau2.task_ids(target)]

    return [q.id for q in bfcl_memory.load(target).questions]


def _builder(view: str):
    def build(ctx: ViewContext) -> View:
        try:
            ids = view_task_ids(view)
        except ImportError as exc:  # the harness's package is not installed here
            return View(view, OOD_TEST, unavailable=f"harness not installed: {exc}")
        return View(view, OOD_TEST, tuple(ids), env=harness_env(view))

    return build


def _unavailable(view: str, reason: str):
    return lambda ctx: View(view, OOD_TEST, unavailable=reason)


for _name in AVAILABLE_VIEWS:
    register_in(OOD_VIEWS, _name)(_builder(_name))
for _name, _reason in UNAVAILABLE_VIEWS.items():
    register_in(OOD_VIEWS, _name)(_unavailable(_name, _reason))


def unavailable_views(names: Sequence[str]) -> dict[str, str]:
    """The offline-impossible harness views, listed with their reasons
    whenever any harness view is asked for."""
    if not any(n in AVAILABLE_VIEWS or n in UNAVAILABLE_VIEWS for n in names):
        return {}
    return dict(UNAVAILABLE_VIEWS)


def harness_notes(views: Sequence[View], weights: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """What the summary and report must say beside each harness view's score:
    its label, and for tau2 the user-simulator model and why the numbers are
    not comparable to published ones. ``weights``: snapshot -> its weights."""
    notes: dict[str, dict[str, Any]] = {}
    for v in views:
        if not is_harness(v.env):
            continue
        harness = v.env[HARNESS_KEY]
        if harness == "tau2":
            notes[v.name] = {
                "label": f"tau^2-bench {v.env['domain']} (base split)",
                "user_simulator_model": USER_SIMULATOR,
                "user_simulator_weights": dict(weights),
                "comparability": TAU2_SIMULATOR_NOTE,
            }
        else:
            notes[v.name] = {
                "label": MEMORY_LABEL,
                "backend": v.env["backend"],
                "comparability": "the kv + rec_sum subset of BFCL V4 Memory, never the full Memory "
                "score (the vector backend needs the network)",
            }
    return notes


def note_lines(notes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per harness view, for the console summary and the report."""
    lines = []
    for view, n in notes.items():
        if "user_simulator_model" in n:
            models = ", ".join(f"{s}: {w}" for s, w in n["user_simulator_weights"].items())
            lines.append(
                f"{view} ({n['label']}): user simulator = {n['user_simulator_model']} [{models}]; {n['comparability']}"
            )
        else:
            lines.append(f"{view}: {n['label']}, {n['backend']} backend; {n['comparability']}")
    return lines
