"""Where a run stands (learner step, policy version, cumulative cost) and what keeps it:
checkpoints, which `resume=RUN_DIR` continues from, and frozen snapshots, which evaluation
reads (seal/run/snapshots.py). Both go to the run's storage (``trainer.storage``,
seal/runtime/storage.py); the snapshot index stays in the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seal.run.snapshots import INDEX, next_name, snapshot_root, write_snapshot
from seal.runtime.calls import COORDINATOR_TIMEOUT_S, bounded_get
from seal.runtime.storage import checkpoint_dir

if TYPE_CHECKING:
    from seal.run.progress import Progress
    from seal.runtime.actor_set import ActorSet

TOTALS = ("wall_s", "update_tokens", "rollout_tokens")


class RunState:
    def __init__(
        self,
        run_dir: Path,
        storage: Path,
        actors: ActorSet,
        progress: Progress,
        model_path: str,
        checkpoint_keep: int,
        resumed: Mapping[str, Any] | None,
    ) -> None:
        """``resumed``: the driver's part of the checkpoint the learner loaded (None: a fresh run)."""
        self.run_dir, self.storage, self.actors, self.progress = run_dir, storage, actors, progress
        self.model_path, self.checkpoint_keep = model_path, checkpoint_keep
        self.step = int(resumed["step"]) if resumed else 0
        self.version = int(resumed["policy_version"]) if resumed else 0
        # Cumulative cost, carried across resumes (snapshot records report it).
        self.totals: dict[str, float] = dict(resumed.get("totals", {})) if resumed else {}
        for key in TOTALS:
            self.totals.setdefault(key, 0.0)
        self.started = time.perf_counter()

    def count_tokens(self, update: float, rollout: float) -> None:
        self.totals["update_tokens"] += update
        self.totals["rollout_tokens"] += rollout

    def _totals_now(self) -> dict[str, float]:
        return {**self.totals, "wall_s": self.totals["wall_s"] + time.perf_counter() - self.started}

    def checkpoint(self, slots: Mapping[str, Any]) -> Path:
        """The learner's state and the driver's (coordinator, task slots, position, totals)."""
        path = checkpoint_dir(self.storage)
        self.progress.learner_phase(f"checkpoint step {self.step} to {path}")
        coordinator = bounded_get(
            self.actors.coordinator.state_dict.remote(),
            COORDINATOR_TIMEOUT_S,
            f"coordinator state_dict for the checkpoint of step {self.step}",
        )
        extra = {
            "coordinator": coordinator,
            "step": self.step,
            "policy_version": self.version,
            "slots": slots,
            "totals": self._totals_now(),
        }
        self.actors.learners.save_checkpoint(str(path), extra, keep=self.checkpoint_keep)
        return path

    def needs_base_snapshot(self) -> bool:
        """A fresh run into a directory without snapshots starts with A_0."""
        return not (snapshot_root(self.run_dir) / INDEX).exists()

    def snapshot(self, initial: bool = False, metrics: Mapping[str, Any] | None = None) -> Path:
        """A frozen snapshot (seal/run/snapshots.py); A_0 references the base model."""
        from weights.model_assets import load_tokenizer

        state = bounded_get(
            self.actors.coordinator.state_dict.remote(),
            COORDINATOR_TIMEOUT_S,
            f"coordinator state_dict for the snapshot at step {self.step}",
        )
        name = next_name(self.run_dir)
        weights = self.model_path
        if not initial:
            self.progress.learner_phase(f"snapshot {name} (step {self.step}, policy v{self.version})")
            out = snapshot_root(self.storage) / name
            path, _ = self.actors.learners.publish(str(out), self.version)
            load_tokenizer(self.model_path).save_pretrained(path)  # vLLM loads the directory alone
            # Relative inside the run dir (it can move); absolute on a storage of its own.
            weights = (
                str(Path(path).relative_to(self.run_dir)) if Path(path).is_relative_to(self.run_dir) else str(path)
            )
        record = {
            "name": name,
            "step": self.step,
            "policy_version": self.version,
            "interface_version": state["interface"]["version"],
            "weights": weights,
            **self._totals_now(),
        }
        return write_snapshot(self.run_dir, record, state["interface"], state["capability"], metrics)
