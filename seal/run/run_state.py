"""Where a run stands (learner step, policy version, cumulative cost) and what keeps it:
checkpoints, which `resume=RUN_DIR` continues from, and frozen snapshots, which evaluation
reads (seal/run/snapshots.py). Both go to the run's storage (``trainer.storage``,
seal/runtime/storage.py); the snapshot index stays in the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.coordinator.coordinator import CoordinatorState
from replay.slots import SlotPosition
from seal.run.snapshots import INDEX, next_name, snapshot_root, write_snapshot
from seal.runtime.calls import COORDINATOR_TIMEOUT_S, bounded_get
from seal.runtime.storage import checkpoint_dir
from weights.model_assets import load_tokenizer

if TYPE_CHECKING:
    from seal.run.progress import Progress
    from seal.runtime.actor_set import ActorSet

TOTALS = ("wall_s", "update_tokens", "rollout_tokens")


@dataclass(frozen=True)
class DriverState:
    """The driver's part of a checkpoint, beside the learner's own state: where the run stood.
    Written by ``RunState.checkpoint`` (learner rank 0 keeps it as JSON in learner.json), read back
    by `resume=RUN_DIR`."""

    step: int  # learner steps done
    policy_version: int
    coordinator: CoordinatorState  # capability state, tag weights, interface
    slots: SlotPosition  # the task stream's position
    totals: dict[str, float]  # cumulative cost (TOTALS), carried across resumes

    def to_dict(self) -> dict[str, Any]:
        """As JSON takes it (learner.json)."""
        return {**asdict(self), "coordinator": self.coordinator.to_dict(), "slots": self.slots.to_dict()}

    @classmethod
    def from_dict(cls, extra: Mapping[str, Any]) -> DriverState:
        """From a checkpoint's extra state; one line naming what is missing (a checkpoint not written by `seal train`)."""
        missing = [f.name for f in fields(cls) if f.name not in extra and f.name != "totals"]
        if missing:
            raise ValueError(
                f"the checkpoint holds no driver state {', '.join(missing)}: was it written by seal train?"
            )
        return cls(
            step=int(extra["step"]),
            policy_version=int(extra["policy_version"]),
            coordinator=CoordinatorState.from_dict(extra["coordinator"]),
            slots=SlotPosition.from_dict(extra["slots"]),
            totals={k: float(v) for k, v in dict(extra.get("totals", {})).items()},  # older checkpoints: none
        )


class RunState:
    def __init__(
        self,
        run_dir: Path,
        storage: Path,
        actors: ActorSet,
        progress: Progress,
        model_path: str,
        checkpoint_keep: int,
        resumed: DriverState | None,
    ) -> None:
        """``resumed``: the driver's part of the checkpoint the learner loaded (None: a fresh run)."""
        self.run_dir, self.storage, self.actors, self.progress = run_dir, storage, actors, progress
        self.model_path, self.checkpoint_keep = model_path, checkpoint_keep
        self.step = resumed.step if resumed else 0
        self.version = resumed.policy_version if resumed else 0
        # Cumulative cost, carried across resumes (snapshot records report it).
        self.totals: dict[str, float] = dict(resumed.totals) if resumed else {}
        for key in TOTALS:
            self.totals.setdefault(key, 0.0)
        self.started = time.perf_counter()

    def count_tokens(self, update: float, rollout: float) -> None:
        self.totals["update_tokens"] += update
        self.totals["rollout_tokens"] += rollout

    def _totals_now(self) -> dict[str, float]:
        return {**self.totals, "wall_s": self.totals["wall_s"] + time.perf_counter() - self.started}

    def checkpoint(self, slots: SlotPosition) -> Path:
        """The learner's state and the driver's (coordinator, task slots, position, totals)."""
        path = checkpoint_dir(self.storage)
        self.progress.learner_phase(f"checkpoint step {self.step} to {path}")
        coordinator: CoordinatorState = bounded_get(
            self.actors.coordinator.state.remote(),
            COORDINATOR_TIMEOUT_S,
            f"coordinator state for the checkpoint of step {self.step}",
        )
        extra = DriverState(self.step, self.version, coordinator, slots, self._totals_now())
        self.actors.learners.save_checkpoint(str(path), extra.to_dict(), keep=self.checkpoint_keep)
        return path

    def needs_base_snapshot(self) -> bool:
        """A fresh run into a directory without snapshots starts with A_0."""
        return not (snapshot_root(self.run_dir) / INDEX).exists()

    def snapshot(self, initial: bool = False, metrics: Mapping[str, Any] | None = None) -> Path:
        """A frozen snapshot (seal/run/snapshots.py); A_0 references the base model."""
        state: CoordinatorState = bounded_get(
            self.actors.coordinator.state.remote(),
            COORDINATOR_TIMEOUT_S,
            f"coordinator state for the snapshot at step {self.step}",
        )
        name = next_name(self.run_dir)
        weights = self.model_path
        if not initial:
            self.progress.learner_phase(f"snapshot {name} (step {self.step}, policy v{self.version})")
            out = snapshot_root(self.storage) / name
            path, _ = self.actors.learners.save_snapshot(str(out), self.version)
            load_tokenizer(self.model_path).save_pretrained(path)  # vLLM loads the directory alone
            # Relative inside the run dir (it can move); absolute on a storage of its own.
            weights = (
                str(Path(path).relative_to(self.run_dir)) if Path(path).is_relative_to(self.run_dir) else str(path)
            )
        record = {
            "name": name,
            "step": self.step,
            "policy_version": self.version,
            "interface_version": state.interface["version"],
            "weights": weights,
            **self._totals_now(),
        }
        return write_snapshot(self.run_dir, record, state.interface, state.capability, metrics)
