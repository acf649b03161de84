"""How long the learner ranks' storage I/O may take: a checkpoint, a resume and a frozen snapshot,
each bounded by its own bytes (pure functions; seal/estimate/plan.py reads the model's config.json).

Every other call on the learner group is bounded by ``learner.timeout_s`` (600 s). That one bound
also covered a checkpoint (a 7B model with AdamW state writes ~91 GB), its resume (the same bytes
read) and a snapshot (~30 GB of fp32 safetensors): at 150 MB/s of shared storage the checkpoint
alone needs ten minutes, so the run would stop with "learner checkpoint ... did not finish in
time" while the ranks were still writing. Each now gets ``learner.timeout_s`` plus its bytes at
``trainer.storage_min_mb_s``, the slowest storage the run is meant to survive.

One wait inside a checkpoint those bounds do not reach: under ZeRO-1/2 on several ranks rank 0 alone
writes the model states, the fp32 weights whole (DeepSpeed's ``save_non_zero_checkpoint`` is the
data-parallel writer's; ZeRO-3 partitions them), while the others, their own partitions written,
wait in the barrier that closes DeepSpeed's ``save_checkpoint`` (deepspeed/runtime/engine.py).
That barrier is a collective of the training group, bounded by its timeout, ``learner.timeout_s``
(learner/rank_shards.py ``join_group``), not by the checkpoint's bound: when rank 0's extra write takes
longer at the slowest storage, the waiting ranks are torn down. ``closing_barrier_problem`` says so
for `seal plan` and the preflight (``seal train`` refuses such a run in one line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from seal.estimate.memory import GB, LearnerSetup, ModelSpec, trained_params

MB = 1e6


def checkpoint_bytes(m: ModelSpec, s: LearnerSetup) -> float:
    """What a checkpoint writes, every rank's files together (a resume reads the same), as
    seal/estimate/memory.py counts the state it holds: fp32 weights 4P (ZeRO-1/2 write them whole
    beside the partitions; ZeRO-3's are in the partitions), the fp32 master partition where ZeRO-1/2
    (or an offloaded ZeRO-3) keep one, AdamW's m and v 8P. The reference model is never saved; under
    LoRA P is the adapter's (the frozen base comes from model_path at every start)."""
    p, stage = trained_params(m, s), s.stage
    master = 4 * p if stage in (1, 2) or (stage == 3 and s.offload_optimizer) else 0
    return float(4 * p + master + (8 * p if s.optimizer == "adamw" else 0))


def snapshot_bytes(m: ModelSpec) -> float:
    """A frozen snapshot: the weights as trained (fp32) in safetensors, written by rank 0."""
    return float(4 * m.params())


@dataclass(frozen=True)
class IoBounds:
    """Seconds the driver waits for a checkpoint or resume (``checkpoint_s``) and for a snapshot
    (``snapshot_s``) on every rank: ``base_s`` (learner.timeout_s) plus the bytes at ``min_mb_s``."""

    checkpoint_bytes: float
    snapshot_bytes: float
    base_s: float
    min_mb_s: float

    def __post_init__(self) -> None:
        if self.min_mb_s <= 0 or self.base_s <= 0:
            raise ValueError(f"trainer.storage_min_mb_s and learner.timeout_s must be > 0, got {self}")

    def bound(self, nbytes: float) -> float:
        return self.base_s + nbytes / (self.min_mb_s * MB)

    @property
    def checkpoint_s(self) -> float:
        return self.bound(self.checkpoint_bytes)

    @property
    def snapshot_s(self) -> float:
        return self.bound(self.snapshot_bytes)

    def describe(self) -> str:
        return (
            f"checkpoint {self.checkpoint_bytes / GB:.1f} GB (a resume reads it): {self.checkpoint_s:.0f} s; "
            f"snapshot {self.snapshot_bytes / GB:.1f} GB: {self.snapshot_s:.0f} s "
            f"(learner.timeout_s {self.base_s:g} s + the bytes at trainer.storage_min_mb_s={self.min_mb_s:g} MB/s)"
        )


def io_bounds(m: ModelSpec, s: LearnerSetup, base_s: float, min_mb_s: float) -> IoBounds:
    return IoBounds(checkpoint_bytes(m, s), snapshot_bytes(m), float(base_s), float(min_mb_s))


def closing_barrier_s(m: ModelSpec, s: LearnerSetup, min_mb_s: float) -> float:
    """Seconds the other ranks of a ZeRO-1/2 group wait for rank 0 in a checkpoint's closing barrier:
    its extra write, the fp32 weights (4P), at ``min_mb_s``; 0 where every rank writes alike."""
    if s.stage not in (1, 2) or s.world_size < 2:
        return 0.0
    return 4 * trained_params(m, s) / (float(min_mb_s) * MB)


def closing_barrier_problem(m: ModelSpec, s: LearnerSetup, timeout_s: float, min_mb_s: float) -> str | None:
    """The plan's line for a checkpoint whose closing barrier would outlast the training group's
    timeout (module docstring), with what would fit; None when it would not."""
    wait = closing_barrier_s(m, s, min_mb_s)
    if wait <= float(timeout_s):
        return None
    enough = int(math.ceil(wait / 100.0) * 100)
    return (
        f"a checkpoint under ZeRO-{s.stage} over {s.world_size} ranks: rank 0 alone writes the "
        f"{4 * trained_params(m, s) / GB:.1f} GB of fp32 weights while the others wait in DeepSpeed's closing barrier, "
        f"{wait:.0f} s at trainer.storage_min_mb_s={min_mb_s:g} MB/s, past the training group's timeout "
        f"(learner.timeout_s={timeout_s:g} s; the waiting ranks would be torn down): "
        f"set learner.timeout_s={enough}, use ZeRO-3 (learner=zero3) or trainer.checkpoint_every=0"
    )
