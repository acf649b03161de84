"""The run's collective groups against the devices their members are on, before anything starts
(`seal plan`'s problems and `seal train`'s preflight, both through seal/estimate/plan.py).

Two groups carry tensors between processes: the learner's training group (its ranks; NCCL on CUDA,
gloo on the CPU: seal/runtime/learner_group.py) and, with ``generator.weight_sync=broadcast``, the
weight group of learner rank 0 and every replica's workers, whose backend follows the learner's
device (seal/run/pipeline.py). Two configurations passed every earlier check and failed only late:

- the two ends of the weight group on different devices (a CUDA replica, the learner on the CPU:
  gloo asked of a replica whose weight-transfer engine is NCCL; the reverse asks NCCL of a CPU
  process). The group's backend serves one device, so both ends must be on it;
- two members of one NCCL communicator on one GPU (a learner and a replica each given half of the
  one GPU there: Ray packs fractions onto the same device, and NCCL refuses a communicator with
  two ranks on one device, at its init, after the engines have started).
"""

from __future__ import annotations

from typing import Any

from seal.config import Settings


def group_problems(s: Settings, cluster: Any) -> list[str]:
    """One line per collective group its members' devices cannot form (empty: none). ``s``: the
    config's typed groups; ``cluster``: the built ``cluster`` group (seal.cluster_config.ClusterConfig),
    for what each actor reserves."""
    learner, generator, world = s.learner.device, s.generator.device, s.learner.world_size
    broadcast = s.generator.weight_sync == "broadcast"
    tp, replicas = s.generator.tensor_parallel_size, s.generator.replicas
    problems = []
    if broadcast and learner != generator:
        backend, on = ("nccl", "CUDA") if learner == "cuda" else ("gloo", "the CPU")
        problems.append(
            f"generator.weight_sync=broadcast puts learner rank 0 (learner.cfg.device={learner}) and the "
            f"generator's workers (generator.device={generator}) in one {backend} weight group, which "
            f"serves {on} at both ends: set learner.cfg.device={generator}, or generator.weight_sync=reload"
        )
    per_rank = float(cluster.learner.num_gpus)
    per_worker = float(cluster.generator.num_gpus) / tp
    if learner == "cuda" and world > 1 and 0 < per_rank < 1:
        problems.append(
            f"learner.world_size={world} CUDA ranks with cluster.learner.num_gpus={per_rank:g} each: Ray may put "
            "two ranks of the NCCL training group on one GPU, which NCCL refuses; give each rank a whole GPU "
            "(cluster.learner.num_gpus=1)"
        )
    if broadcast and learner == generator == "cuda":
        # Members holding a fraction of a GPU: two of them may share one (a whole GPU is nobody else's).
        shared = ([f"learner rank 0 (cluster.learner.num_gpus={per_rank:g})"] if 0 < per_rank < 1 else []) + (
            [
                f"{replicas * tp} generator worker(s) ({cluster.generator.num_gpus:g} GPUs over tensor_parallel_size={tp})"
            ]
            if 0 < per_worker < 1
            else []
        )
        if 0 < per_worker < 1 and replicas * tp > 1 or len(shared) > 1:
            problems.append(
                f"the NCCL weight group's members {' and '.join(shared)} hold fractions of a GPU: Ray may put "
                "two on one GPU, which NCCL refuses at the group's init; give learner ranks a whole GPU "
                "(cluster.learner.num_gpus=1) and each replica tensor_parallel_size whole GPUs, or generator.weight_sync=reload"
            )
    return problems
