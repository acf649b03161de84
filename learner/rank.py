"""One rank of the learner group as a Ray actor (the driver side is seal/learner_group.py).

Built in two calls so the group can meet where rank 0 runs: the actor starts
empty, rank 0 reports its node's address and a free port there, then every
rank joins the torch.distributed group and builds its Learner (DeepSpeed finds
the group formed). Every method that touches the model is a collective under
ZeRO-3: the driver calls it on all ranks at once.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Mapping

from learner.engine import Learner
from learner.group import RankShard, Rendezvous, join_group
from learner.worker import LearnerWorker


class LearnerRank(LearnerWorker):
    def __init__(self, threads: int | None = None) -> None:  # noqa: D107 (the learner comes in start)
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.learner: Learner | None = None
        self.broadcaster = None
        self.rank = -1

    def address(self) -> tuple[str, int]:
        """This node's IP (never loopback: other nodes must reach it) and a free port on it."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def node(self) -> dict[str, Any]:
        import ray

        return {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def start(self, rendezvous: Rendezvous, make_learner: Callable[[], Learner]) -> int:
        """Join the group and build this rank's learner; returns its rank."""
        if rendezvous.world_size > 1:
            join_group(rendezvous)
        self.learner = make_learner()
        if self.learner.world_size != rendezvous.world_size:
            raise ValueError(f"the learner was configured for world_size={self.learner.world_size}, the group has {rendezvous.world_size}")
        self.rank = rendezvous.rank
        return self.rank

    def train_shard(self, shard: RankShard, tag_weights: Mapping[str, float], group_weights: Mapping[str, float] | None,
                    policy_version: int | None) -> dict[str, Any]:
        out = self.learner.train_batch(shard.trajectories, tag_weights, group_weights, policy_version=policy_version,
                                       mini_groups=shard.mini_groups)
        out["tag_weights"] = dict(tag_weights)
        return out

    def canary_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.learner.canary_logprobs(token_ids)

    def broadcast_weights(self) -> float:
        """Rank 0 sends over the weight group; the other ranks only join the ZeRO-3 bucket gathers."""
        if self.rank == 0 and self.broadcaster is None:
            raise RuntimeError("broadcast_weights before join_weight_group")
        return self.learner.broadcast_weights(self.broadcaster if self.rank == 0 else None)

    def save_checkpoint(self, path: str, extra: Mapping[str, Any], keep: int = 0) -> str:
        return str(self.learner.save_checkpoint(path, extra, keep))

    def param_share(self) -> dict[str, int]:
        """Parameters this rank holds, from the partitioned tensors (ZeRO-3: ds_tensor), against the
        model's full count (ds_numel); the reference model's too (0 and 0: none)."""
        def count(module) -> tuple[int, int]:
            held = total = 0
            for p in module.parameters():
                held += p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                total += getattr(p, "ds_numel", p.numel())
            return held, total

        held, total = count(self.learner.model)
        ref = self.learner.ref
        ref_held, ref_total = count(getattr(ref, "module", ref)) if ref is not None else (0, 0)
        return {"held": held, "total": total, "ref_held": ref_held, "ref_total": ref_total}

    # ------------------------------------------------------------ profiling (seal bench learner-scale)
    def comm_profile(self, enabled: bool) -> None:
        """DeepSpeed's comms logger on or off, its records cleared (it times each collective call)."""
        import deepspeed.comm as dscomm
        from deepspeed.comm.comm import comms_logger

        dscomm.configure(enabled=enabled, prof_all=enabled)
        comms_logger.comms_dict = {}

    def comm_seconds(self) -> float:
        from deepspeed.comm.comm import comms_logger

        return sum(sum(rec[1]) for sizes in comms_logger.comms_dict.values() for rec in sizes.values()) / 1000.0

    def peak_memory_gb(self) -> float:
        """Peak device memory under CUDA, else this process's peak resident set (VmHWM)."""
        import torch

        if torch.cuda.is_available() and self.learner is not None and self.learner.cfg.device == "cuda":
            return torch.cuda.max_memory_allocated() / 2**30
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20
