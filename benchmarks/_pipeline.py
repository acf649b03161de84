"""Running the real pipeline (seal/run/pipeline.py) for the benchmarks that time it.

One Ray session per benchmark part, started here, so every pipeline of the
part (sync and async, repeat after repeat) reuses it and pays only for its own
actors. Pipelines run with checkpoints off: a checkpoint every step would be
timed as part of the step and is not what the comparison is about.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import log
from seal.config import compose, instantiate
from seal.run.pipeline import Pipeline
from seal.run.run_dir import create_run_dir
from seal.runtime.placement import start_ray

# Applied before the user's overrides (which win): the toy env keeps steps
# short enough to repeat; checkpoints and snapshots are not part of a step.
# Every group reaches the learner (no zero-variance filter): a benchmark measures the same
# learner work each step, whatever rewards the model happens to earn.
BASE_OVERRIDES = [
    "env=toy",
    "trainer.checkpoint_every=0",
    "trainer.snapshot_every=0",
    "trainer.filter_groups=none",
    "trainer.oversample=0",
]


def compose_cfg(overrides: Sequence[str], defaults: Sequence[str] = ()):
    return compose([*BASE_OVERRIDES, *defaults, *overrides])


@contextlib.contextmanager
def ray_session(cfg) -> Iterator[None]:
    import ray

    owns = not ray.is_initialized()
    start_ray(instantiate(cfg.cluster))
    try:
        yield
    finally:
        if owns:
            ray.shutdown()


class PipelineRun:
    """One pipeline: build it, optionally use its idle actors first (``before``),
    run ``warmup + steps`` learner steps, close it. ``rows`` are the measured
    steps' metrics rows; ``staleness`` the staleness of every group the
    learner took during them; ``trainer`` the trainer settings it ran with."""

    def __init__(
        self, cfg, overrides: Sequence[str], steps: int, warmup: int, before: Callable[[Any], Any] | None = None
    ) -> None:
        self.before_result = None
        self.staleness: list[int] = []
        with tempfile.TemporaryDirectory(prefix="seal-bench-") as tmp:
            pipeline = Pipeline(cfg, create_run_dir(str(Path(tmp) / "run"), cfg, list(overrides)))
            self.trainer = pipeline.trainer
            try:
                self._record_staleness(pipeline, warmup)
                if before is not None:
                    self.before_result = before(pipeline)
                log(f"  pipeline mode={self.trainer.mode}: {warmup} warm-up + {steps} measured steps")
                self.all_rows = pipeline.run(warmup + steps)
            finally:
                pipeline.close()
        self.rows = self.all_rows[warmup:]

    def _record_staleness(self, pipeline, warmup: int) -> None:
        """Wrap the replay server's take_batch (instance attribute, this
        pipeline only): the metrics rows carry only the mean and max per step,
        the distribution needs every group."""
        take = pipeline.replay.take_batch

        def take_batch():
            groups = take()
            if groups is not None and pipeline.state.step >= warmup:
                self.staleness.extend(g.staleness for g in groups)
            return groups

        pipeline.replay.take_batch = take_batch


def stage_times(row: dict[str, Any]) -> dict[str, float]:
    """Where a learner step's wall time went. In sync mode the step is
    generation, then learning, then publishing, one after another, so what is
    neither learning nor publishing is generation (env steps and transport
    included: they are part of producing the batch)."""
    learn = float(row["wait_s"]["learner"])
    publish = float(row["publish_s"] or 0.0)
    return {
        "step": float(row["step_s"]),
        "learn": learn,
        "publish": publish,
        "generate": max(0.0, float(row["step_s"]) - learn - publish),
    }


def env_fraction(rows: Sequence[dict[str, Any]]) -> float | None:
    """Env steps + verifier + diagnosis seconds over generator-wait seconds, same groups."""
    gen = sum(r["wait_s"]["generate"] for r in rows)
    return sum(r["wait_s"]["env"] for r in rows) / gen if gen else None


def trajectories_per_s(row: dict[str, Any], n: int) -> float:
    return row["groups_generated"] * n / row["step_s"]
