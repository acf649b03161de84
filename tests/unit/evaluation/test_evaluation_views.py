"""evaluation.views and evaluation.catalog: the split functions, view builders
and the joined registry, on the real BFCL split and the toy env's ids (no model)."""

from __future__ import annotations

from collections import Counter

import pytest

from env_pool.bfcl.tasks import split_ids
from env_pool.toy.env import ToyToolEnv
from evaluation.catalog import VIEW_BUILDERS, build_views, register_view, stratified_head, task_category
from evaluation.config import EvalConfig
from evaluation.view_base import View, ViewContext
from evaluation.views import ID_VIEWS, schedule_record, training_task_ids, validation_task_ids

TRAIN = split_ids("train")


def ctx(config: EvalConfig, pool=None, trained: int = 10, split=split_ids) -> ViewContext:
    return ViewContext(config, split, (lambda: pool if pool is not None else TRAIN), trained)


def test_validation_is_stratified_from_the_end_and_disjoint_from_training():
    val = validation_task_ids(TRAIN, 40)
    # The split lists one category after another: a plain tail would be all long_context.
    assert Counter(map(task_category, val)) == {"base": 10, "miss_func": 10, "miss_param": 10, "long_context": 10}
    base = [t for t in TRAIN if task_category(t) == "base"]
    assert [t for t in val if t in base] == base[-10:]
    train = training_task_ids(TRAIN, 40)
    assert len(train) == 360 and not set(train) & set(val)
    assert train == [t for t in TRAIN if t not in set(val)]  # order kept: the task stream is otherwise unchanged
    assert training_task_ids(TRAIN, 0) == TRAIN and validation_task_ids(TRAIN, 0) == []


def test_uneven_validation_size_and_toy_ids():
    toy = ToyToolEnv().task_ids("train")
    val = validation_task_ids(toy, 7)
    counts = Counter(map(task_category, val))
    assert sum(counts.values()) == 7 and max(counts.values()) - min(counts.values()) <= 1 and len(counts) == 3
    assert set(val) <= set(toy[-12:])


def test_training_on_all_removes_the_validation_slice_of_the_train_split():
    every = split_ids("all")
    val = set(validation_task_ids(TRAIN, 40))
    kept = training_task_ids(every, 40, train_ids=TRAIN)
    assert len(kept) == 760 and not val & set(kept)


def test_heldout_categories_leave_training_and_form_the_ood_view():
    cfg = EvalConfig(validation_size=30, heldout_categories=("long_context",))
    train = training_task_ids(TRAIN, 30, ("long_context",))
    assert "long_context" not in set(map(task_category, train)) and len(train) == 270
    views = {v.name: v for v in build_views(["validation", "id", "ood", "replay"], ctx(cfg, pool=train, trained=5))}
    assert set(map(task_category, views["validation"].task_ids)) == {"base", "miss_func", "miss_param"}
    assert len(views["id"].task_ids) == 300 and "long_context" not in set(map(task_category, views["id"].task_ids))
    assert len(views["ood"].task_ids) == 100 and set(map(task_category, views["ood"].task_ids)) == {"long_context"}
    assert set(views["ood"].task_ids) <= set(split_ids("test"))
    assert views["replay"].task_ids == tuple(train[:5])  # the groups the learner consumed, in slot order
    # Views never share a task with one another except replay (a subset of training) and none of training is validated.
    assert not set(views["validation"].task_ids) & set(train)
    assert not set(views["id"].task_ids) & set(TRAIN)


def test_without_heldout_categories_ood_is_reported_unavailable():
    views = build_views(["ood", "id"], ctx(EvalConfig()))
    assert views[0].unavailable and views[0].task_ids == ()
    assert len(views[1].task_ids) == 400 and views[1].unavailable is None


def test_limits_are_stratified_and_per_view():
    cfg = EvalConfig(limit=8, view_limits={"replay": 3})
    views = {v.name: v for v in build_views(["validation", "id", "replay"], ctx(cfg, trained=1000))}
    assert Counter(map(task_category, views["id"].task_ids)) == {
        c: 2 for c in ("base", "miss_func", "miss_param", "long_context")
    }
    assert len(views["validation"].task_ids) == 8 and len(views["replay"].task_ids) == 3
    assert len(set(map(task_category, views["replay"].task_ids))) == 3  # the pool spans categories: so does the cut
    assert stratified_head(["toy_0", "toy_3", "toy_1"], 2) == ["toy_0", "toy_1"]  # order kept
    assert stratified_head(["toy_0"], None) == ["toy_0"]


def test_replay_covers_the_pool_after_an_epoch_and_needs_a_step():
    pool = TRAIN[:6]
    (view,) = build_views(["replay"], ctx(EvalConfig(), pool=pool, trained=50))
    assert view.task_ids == tuple(pool)
    (view,) = build_views(["replay"], ctx(EvalConfig(), pool=pool, trained=0))
    assert view.unavailable


def test_registry_takes_new_views_and_rejects_unknown_ones():
    assert set(ID_VIEWS) == {"validation", "id", "ood", "replay"}
    assert all(VIEW_BUILDERS[name] is builder for name, builder in ID_VIEWS.items())  # the catalog holds them
    with pytest.raises(ValueError, match="unknown views"):
        build_views(["tau2_retail_not_registered"], ctx(EvalConfig()))
    name = "test_other_env"
    env = {"_target_": "env_pool.toy.env.ToyToolEnv", "tool_format": "json"}
    register_view(name)(lambda c: View(name, "ood", tuple(ToyToolEnv().task_ids("test")[:9]), env))
    try:
        (view,) = build_views([name], ctx(EvalConfig(limit=3)))
        assert view.role == "ood" and view.env == env and len(view.task_ids) == 3
        with pytest.raises(ValueError, match="twice"):
            register_view(name)(lambda c: None)
    finally:
        del VIEW_BUILDERS[name]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"validation_size": -1}, "validation_size"),
        ({"views": []}, "empty"),
        ({"limit": 0}, "limit"),
        ({"schedule": {"epoch": 1}}, "schedule"),
    ],
)
def test_bad_eval_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**kwargs)


def test_split_errors():
    with pytest.raises(ValueError, match="nothing to train on"):
        validation_task_ids(TRAIN[:5], 5)
    with pytest.raises(KeyError, match="category rule"):
        task_category("tau2_retail_0")


def test_schedule_is_derived_and_claims_are_checked():
    kw = dict(pool_size=360, groups_per_step=4, rollouts=8, mini_batch_groups=2, steps=180, snapshot_every=10)
    rec = schedule_record({"state_persistence": "carried", "assessment_timing": 10}, **kw)
    assert rec == {
        "state_persistence": "carried",
        "task_reuse": "cycle",
        "train_size": 360,
        "batch_size": 32,
        "epochs": 2.0,
        "updates_per_batch": 2,
        "assessment_timing": 10,
    }
    with pytest.raises(ValueError, match="batch_size"):
        schedule_record({"batch_size": 16}, **kw)
