"""The evaluation config, configs/evaluation/default.yaml (docs/design.md, evaluation)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluation.records import ID_TEST, OOD_TEST, REPLAY, VALIDATION

SCHEDULE_FIELDS: tuple[str, ...] = (
    "state_persistence",
    "task_reuse",
    "train_size",
    "batch_size",
    "epochs",
    "updates_per_batch",
    "assessment_timing",
)


@dataclass(frozen=True)
class EvalConfig:
    """configs/evaluation/default.yaml. ``validation_size`` and
    ``heldout_categories`` also shape training (``evaluation.views.training_task_ids``),
    so a run's own recorded values are the ones evaluation must use."""

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
    # all: every snapshot of the run on those same tasks (the learning curve; ~80 s a snapshot on the
    # CPU default); ends: A_0 and the final one only.
    final_snapshots: str = "all"

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
        if self.final_snapshots not in ("all", "ends"):
            raise ValueError(f"evaluation.final_snapshots must be all or ends, got {self.final_snapshots!r}")
        unknown = set(self.schedule) - set(SCHEDULE_FIELDS)
        if unknown:
            raise ValueError(f"unknown evaluation.schedule fields {sorted(unknown)}; expected {SCHEDULE_FIELDS}")

    def limit_for(self, view: str) -> int | None:
        return self.view_limits.get(view, self.limit)
