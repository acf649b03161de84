"""Evaluation views built from a run's splits, and the evaluation config
(DESIGN.md section 7).

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

Other OOD views plug in through
``register_view`` (in this module or one it imports, so `seal evaluate` sees
them) plus a ``CATEGORY_RULES`` entry for their task ids: a builder gets a
``ViewContext`` and returns a ``View`` with role "ood" and its own env config
(evaluation/ood_views.py registers the offline harnesses that way: tau2_retail,
tau2_airline, tau2_telecom, bfcl_memory_kv, bfcl_memory_rec_sum). Everything here is pure (ids in, ids out);
the model-running part lives in evaluation/runner.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from evaluation.records import ID_TEST, OOD_TEST, REPLAY, VALIDATION

SCHEDULE_FIELDS: tuple[str, ...] = ("state_persistence", "task_reuse", "train_size", "batch_size", "epochs",
                                    "updates_per_batch", "assessment_timing")


@dataclass(frozen=True)
class EvalConfig:
    """configs/evaluation/default.yaml. ``validation_size`` and
    ``heldout_categories`` also shape training (``training_task_ids``), so a
    run's own recorded values are the ones evaluation must use."""

    views: tuple[str, ...] = (VALIDATION, ID_TEST, OOD_TEST, REPLAY)
    validation_size: int = 40  # tasks of the train split held out of training, stratified over categories
    heldout_categories: tuple[str, ...] = ()  # categories never trained on; tested as the "ood" view
    limit: int | None = None  # tasks per view (stratified over categories); None: all
    view_limits: Mapping[str, int] = field(default_factory=dict)  # per-view limit, wins over ``limit``
    max_new_tokens: int | None = None  # per generation step; None: configs/sampling/eval.yaml's
    schedule: Mapping[str, Any] = field(default_factory=dict)  # the seven schedule fields (SCHEDULE_FIELDS)
    # The main job's closing evaluation (evaluation/frozen.py): A_0 and the final snapshot on the
    # test split, raw interface, greedy. final_per_category: tasks per category (None: all).
    final: bool = True
    final_per_category: int | None = None

    def __post_init__(self) -> None:
        # hydra hands over lists; tuples keep the frozen config hashable and comparable.
        object.__setattr__(self, "views", tuple(self.views))
        object.__setattr__(self, "heldout_categories", tuple(self.heldout_categories))
        object.__setattr__(self, "view_limits", dict(self.view_limits))
        object.__setattr__(self, "schedule", dict(self.schedule))
        if not self.views:
            raise ValueError("evaluation.views is empty")
        if self.validation_size < 0:
            raise ValueError(f"evaluation.validation_size must be >= 0, got {self.validation_size}")
        for name, k in [("limit", self.limit), *self.view_limits.items()]:
            if k is not None and int(k) < 1:
                raise ValueError(f"evaluation limit for {name} must be >= 1, got {k}")
        if self.final_per_category is not None and int(self.final_per_category) < 1:
            raise ValueError(f"evaluation.final_per_category must be >= 1 or null, got {self.final_per_category}")
        unknown = set(self.schedule) - set(SCHEDULE_FIELDS)
        if unknown:
            raise ValueError(f"unknown evaluation.schedule fields {sorted(unknown)}; expected {SCHEDULE_FIELDS}")

    def limit_for(self, view: str) -> int | None:
        return self.view_limits.get(view, self.limit)


# ---------------------------------------------------------------- categories
# Task ids carry their environment in a prefix; a category rule per prefix
# lets the split functions stratify without instantiating any environment.
CATEGORY_RULES: dict[str, Callable[[str], str]] = {}


def _bfcl_category(task_id: str) -> str:
    from env_pool.bfcl.tasks import category_of

    return category_of(task_id)


def _toy_category(task_id: str) -> str:
    from env_pool.toy.env import toy_task

    return toy_task(task_id).category


def _shopping_category(task_id: str) -> str:
    from env_pool.shopping.tasks import get_task

    return get_task(task_id).category


CATEGORY_RULES["multi_turn_"] = _bfcl_category
CATEGORY_RULES["toy_"] = _toy_category
CATEGORY_RULES["shop_"] = _shopping_category


def task_category(task_id: str) -> str:
    for prefix, rule in CATEGORY_RULES.items():
        if task_id.startswith(prefix):
            return rule(task_id)
    raise KeyError(f"no category rule for task id {task_id!r} (register one in evaluation.views.CATEGORY_RULES)")


def _by_category(ids: Sequence[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for t in ids:
        groups.setdefault(task_category(t), []).append(t)
    return groups


def _round_robin(groups: Sequence[Sequence[str]], k: int) -> set[str]:
    taken: set[str] = set()
    depth = 0
    while len(taken) < k and any(depth < len(g) for g in groups):
        for g in groups:
            if depth < len(g) and len(taken) < k:
                taken.add(g[depth])
        depth += 1
    return taken


def stratified_head(ids: Sequence[str], k: int | None) -> list[str]:
    """The first k ids taking categories in turn (BFCL splits list one category
    after another, so a plain head would test one category only). Keeps the
    input order; k None or >= len returns everything."""
    if k is None or k >= len(ids):
        return list(ids)
    keep = _round_robin(list(_by_category(ids).values()), k)
    return [t for t in ids if t in keep]


def validation_task_ids(train_ids: Sequence[str], validation_size: int, heldout_categories: Sequence[str] = ()) -> list[str]:
    """The update-validation slice: the LAST tasks of each category of the
    train split, taken in turn until ``validation_size`` (training starts at
    the head of the split, so a short run and its validation never meet).
    Held-out categories are not validated here: they belong to the OOD view."""
    candidates = [t for t in train_ids if task_category(t) not in set(heldout_categories)]
    if validation_size == 0:
        return []
    if validation_size >= len(candidates):
        raise ValueError(f"evaluation.validation_size={validation_size} leaves nothing to train on "
                         f"({len(candidates)} train tasks outside the held-out categories)")
    keep = _round_robin([list(reversed(g)) for g in _by_category(candidates).values()], validation_size)
    return [t for t in candidates if t in keep]


def training_task_ids(task_ids: Sequence[str], validation_size: int, heldout_categories: Sequence[str] = (),
                      train_ids: Sequence[str] | None = None) -> list[str]:
    """The tasks training may use: ``task_ids`` (the training split) less the
    validation slice of ``train_ids`` (default: ``task_ids`` itself; pass the
    train split when training on another split such as "all") and less every
    held-out category. Order is kept, so the task stream is otherwise unchanged."""
    held = set(validation_task_ids(task_ids if train_ids is None else train_ids, validation_size, heldout_categories))
    heldout = set(heldout_categories)
    keep = [t for t in task_ids if t not in held and task_category(t) not in heldout]
    if not keep:
        raise ValueError("no training tasks left after removing the validation slice and held-out categories")
    return keep


# ---------------------------------------------------------------- views
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
VIEW_BUILDERS: dict[str, ViewBuilder] = {}


def register_view(name: str) -> Callable[[ViewBuilder], ViewBuilder]:
    def add(builder: ViewBuilder) -> ViewBuilder:
        if name in VIEW_BUILDERS:
            raise ValueError(f"view {name!r} is registered twice")
        VIEW_BUILDERS[name] = builder
        return builder

    return add


@register_view(VALIDATION)
def _validation(ctx: ViewContext) -> View:
    cfg = ctx.config
    ids = validation_task_ids(ctx.split_ids("train"), cfg.validation_size, cfg.heldout_categories)
    if not ids:
        return View(VALIDATION, VALIDATION, unavailable="evaluation.validation_size is 0: no update-validation tasks")
    return View(VALIDATION, VALIDATION, tuple(ids))


@register_view(ID_TEST)
def _id_test(ctx: ViewContext) -> View:
    heldout = set(ctx.config.heldout_categories)
    return View(ID_TEST, ID_TEST, tuple(t for t in ctx.split_ids("test") if task_category(t) not in heldout))


@register_view(OOD_TEST)
def _heldout_categories(ctx: ViewContext) -> View:
    heldout = set(ctx.config.heldout_categories)
    if not heldout:
        return View(OOD_TEST, OOD_TEST, unavailable="no OOD view: set evaluation.heldout_categories (train on the "
                                                    "other categories) or register an OOD env view")
    ids = tuple(t for t in ctx.split_ids("test") if task_category(t) in heldout)
    if not ids:
        return View(OOD_TEST, OOD_TEST, unavailable=f"no test task in the held-out categories {sorted(heldout)}")
    return View(OOD_TEST, OOD_TEST, ids)


@register_view(REPLAY)
def _replay(ctx: ViewContext) -> View:
    # Slot k of the stream is pool[k % len(pool)] (replay/slots.py), so the
    # consumed groups cover the head of the pool, all of it after one epoch.
    pool = list(ctx.training_pool())
    if ctx.trained_groups < 1:
        return View(REPLAY, REPLAY, unavailable="the run has no learner step yet: nothing to replay")
    return View(REPLAY, REPLAY, tuple(pool[: min(len(pool), ctx.trained_groups)]))


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
            view = View(view.name, view.role, tuple(stratified_head(view.task_ids, ctx.config.limit_for(name))), view.env)
        views.append(view)
    return views


def schedule_record(declared: Mapping[str, Any], *, pool_size: int, groups_per_step: int, rollouts: int,
                    mini_batch_groups: int, steps: int, snapshot_every: int) -> dict[str, Any]:
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


# The offline OOD harness views (tau2_*, bfcl_memory_*) register themselves on import.
import evaluation.ood_views  # noqa: E402,F401  (after everything it imports from here is defined)
