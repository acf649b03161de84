"""The in-distribution evaluation views and the split functions behind them
(docs/design.md, evaluation).

Views are kept distinct even where they draw on the same split:

- ``validation``: the update-validation view, a held-out slice of the TRAIN
  split that training never sees (``training_task_ids`` removes it), so
  selecting a snapshot on it never selects on update evidence;
- ``id``: the held-in test split (BFCL: the 400 test tasks), less any
  held-out categories;
- ``ood``: the held-out-category view (train on some categories, test on the
  others), available only when ``heldout_categories`` is configured;
- ``replay``: training tasks re-run, the ones the learner consumed, in the
  order the run's task stream visited them.

They are registered in ``ID_VIEWS``; the offline OOD harness views are
evaluation/ood_views.py's, and evaluation/catalog.py joins both (further views
plug in through ``evaluation.catalog.register_view``). A task's category is its
environment's (``env_pool.registry.category_of``), so the split functions
stratify without instantiating any environment. Everything here is pure (ids
in, ids out); the model-running part lives in evaluation/runner.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from env_pool.registry import category_of
from evaluation.config import SCHEDULE_FIELDS
from evaluation.records import ID_TEST, OOD_TEST, REPLAY, VALIDATION
from evaluation.view_base import View, ViewBuilder, ViewContext, by_category, register_in, round_robin

ID_VIEWS: dict[str, ViewBuilder] = {}


def validation_task_ids(
    train_ids: Sequence[str], validation_size: int, heldout_categories: Sequence[str] = ()
) -> list[str]:
    """The update-validation slice: the LAST tasks of each category of the
    train split, taken in turn until ``validation_size`` (training starts at
    the head of the split, so a short run and its validation never meet).
    Held-out categories are not validated here: they belong to the OOD view."""
    candidates = [t for t in train_ids if category_of(t) not in set(heldout_categories)]
    if validation_size == 0:
        return []
    if validation_size >= len(candidates):
        raise ValueError(
            f"evaluation.validation_size={validation_size} leaves nothing to train on "
            f"({len(candidates)} train tasks outside the held-out categories)"
        )
    keep = round_robin([list(reversed(g)) for g in by_category(candidates, category_of).values()], validation_size)
    return [t for t in candidates if t in keep]


def training_task_ids(
    task_ids: Sequence[str],
    validation_size: int,
    heldout_categories: Sequence[str] = (),
    train_ids: Sequence[str] | None = None,
) -> list[str]:
    """The tasks training may use: ``task_ids`` (the training split) less the
    validation slice of ``train_ids`` (default: ``task_ids`` itself; pass the
    train split when training on another split such as "all") and less every
    held-out category. Order is kept, so the task stream is otherwise unchanged."""
    held = set(validation_task_ids(task_ids if train_ids is None else train_ids, validation_size, heldout_categories))
    heldout = set(heldout_categories)
    keep = [t for t in task_ids if t not in held and category_of(t) not in heldout]
    if not keep:
        raise ValueError("no training tasks left after removing the validation slice and held-out categories")
    return keep


# ---------------------------------------------------------------- views
@register_in(ID_VIEWS, VALIDATION)
def _validation(ctx: ViewContext) -> View:
    cfg = ctx.config
    ids = validation_task_ids(ctx.split_ids("train"), cfg.validation_size, cfg.heldout_categories)
    if not ids:
        return View(VALIDATION, VALIDATION, unavailable="evaluation.validation_size is 0: no update-validation tasks")
    return View(VALIDATION, VALIDATION, tuple(ids))


@register_in(ID_VIEWS, ID_TEST)
def _id_test(ctx: ViewContext) -> View:
    heldout = set(ctx.config.heldout_categories)
    return View(ID_TEST, ID_TEST, tuple(t for t in ctx.split_ids("test") if category_of(t) not in heldout))


@register_in(ID_VIEWS, OOD_TEST)
def _heldout_categories(ctx: ViewContext) -> View:
    heldout = set(ctx.config.heldout_categories)
    if not heldout:
        return View(
            OOD_TEST,
            OOD_TEST,
            unavailable="no OOD view: set evaluation.heldout_categories (train on the "
            "other categories) or register an OOD env view",
        )
    ids = tuple(t for t in ctx.split_ids("test") if category_of(t) in heldout)
    if not ids:
        return View(OOD_TEST, OOD_TEST, unavailable=f"no test task in the held-out categories {sorted(heldout)}")
    return View(OOD_TEST, OOD_TEST, ids)


@register_in(ID_VIEWS, REPLAY)
def _replay(ctx: ViewContext) -> View:
    # Slot k of the stream is pool[k % len(pool)] (replay/slots.py), so the
    # consumed groups cover the head of the pool, all of it after one epoch.
    pool = list(ctx.training_pool())
    if ctx.trained_groups < 1:
        return View(REPLAY, REPLAY, unavailable="the run has no learner step yet: nothing to replay")
    return View(REPLAY, REPLAY, tuple(pool[: min(len(pool), ctx.trained_groups)]))


def schedule_record(
    declared: Mapping[str, Any],
    *,
    pool_size: int,
    groups_per_step: int,
    rollouts: int,
    mini_batch_groups: int,
    steps: int,
    snapshot_every: int,
) -> dict[str, Any]:
    """The seven schedule fields as the run actually ran, from its trainer
    settings. The trainer does not read ``evaluation.schedule``, so a declared
    (non-null) value is a claim checked here: one the run contradicts is an
    error rather than a wrong label on the results."""
    derived = {
        "state_persistence": "carried",  # capability state and interface are never reset (rounds, snapshots, resumes)
        "task_reuse": "cycle",  # slot k trains on pool[k % len(pool)]
        "train_size": pool_size,
        "batch_size": groups_per_step * rollouts,  # trajectories per learner step
        "epochs": round(steps * groups_per_step / pool_size, 6) if pool_size else 0.0,
        "updates_per_batch": -(-groups_per_step // max(1, mini_batch_groups)),  # optimizer steps per learner step
        "assessment_timing": snapshot_every,  # snapshot every k learner steps; 0: A_0 and the end of each run only
    }
    for key in SCHEDULE_FIELDS:
        claim = declared.get(key)
        if claim is not None and claim != derived[key]:
            raise ValueError(f"evaluation.schedule.{key} says {claim!r} but the run used {derived[key]!r}")
    return derived
