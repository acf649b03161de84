"""Typed records the evaluation metrics read (docs/design.md, evaluation).

A run is assessed as a sequence of snapshots A_0, A_1, ..., final. Each
snapshot is run on up to four views (update-validation, ID test, OOD test,
replay); every (snapshot, view, task) run yields one ``TaskResult``. These
records are plain values so a run directory can store them as CSV or JSON and
the metrics can be recomputed without a model.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# View names used across the package. Kept as plain strings (not an Enum) so
# records read back from CSV/JSON compare equal without conversion.
VALIDATION = "validation"  # frozen update-validation tasks, never used as update evidence
ID_TEST = "id"  # held-out tasks from the training distribution
OOD_TEST = "ood"  # held-out tasks from another distribution
REPLAY = "replay"  # training tasks re-run, to see forgetting
VIEWS: tuple[str, ...] = (VALIDATION, ID_TEST, OOD_TEST, REPLAY)


@dataclass(frozen=True)
class TaskResult:
    """One task run by one snapshot on one view."""

    snapshot: str
    view: str
    task_id: str
    category: str
    success: bool  # the verifier's verdict; process errors never change it
    reward: float
    tool_calls: int
    generated_tokens: int
    prompt_tokens: int
    wall_s: float
    process_error: str | None = None  # e.g. "timeout after 600 s", "crash: ..."; None when the run was clean
    outcome: str = "completed"  # env_pool.base.Outcome value: completed, step_limit, context_overflow, aborted

    def __post_init__(self) -> None:
        # CSV and JSON round trips hand back strings/ints; normalise so equal
        # records compare equal and arithmetic never sees a str.
        object.__setattr__(self, "success", _as_bool(self.success))
        object.__setattr__(self, "reward", float(self.reward))
        for name in ("tool_calls", "generated_tokens", "prompt_tokens"):
            value = int(getattr(self, name))
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "wall_s", float(self.wall_s))
        if self.process_error == "":
            object.__setattr__(self, "process_error", None)
        if not self.snapshot or not self.view or not self.task_id:
            raise ValueError("snapshot, view and task_id must be non-empty")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskResult:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SnapshotInfo:
    """One assessed snapshot A_t of a run.

    ``wall_s`` and ``update_tokens`` are cumulative from the start of the run
    (training wall time and tokens the learner trained on), so a snapshot can
    be recorded from running counters alone; the metrics take differences
    between adjacent snapshots to get per-interval costs.
    """

    name: str  # "A_0", "A_1", ..., "final"
    step: int  # learner updates applied so far
    policy_version: int
    interface_version: int
    wall_s: float = 0.0
    update_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("snapshot name must be non-empty")
        for name in ("step", "policy_version", "interface_version", "update_tokens"):
            value = int(getattr(self, name))
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "wall_s", float(self.wall_s))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SnapshotInfo:
        return cls(**_known(cls, data))


CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TaskResult))


def write_task_csv(results: Iterable[TaskResult], path: str | Path) -> Path:
    """Write per-task results, one row each, columns in ``CSV_COLUMNS`` order.

    A missing process error is written as an empty cell (read back as None).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in results:
            row = r.to_dict()
            row["process_error"] = row["process_error"] or ""
            writer.writerow(row)
    return path


def read_task_csv(path: str | Path) -> list[TaskResult]:
    with open(path, newline="") as f:
        return [TaskResult.from_dict(row) for row in csv.DictReader(f)]


def _as_bool(value: Any) -> bool:
    # bool("False") is True, so strings from CSV need an explicit parse.
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    # Unknown keys are an error, not silently dropped: a renamed field in a
    # stored record should fail loudly rather than fall back to a default.
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
    return dict(data)
