"""The learner as a service (a Ray actor in the pipeline): train on batches of
complete groups, hand out weight snapshots, checkpoint and restore.

Weights leave through Ray's object store in buckets (actors/weight_buckets.py),
each a name -> numpy array mapping the generator reads zero-copy, one bucket at
a time; the call returns their manifest. They go in the generator's dtype (bf16:
half the bytes), as bits where numpy has no such type (actors/precision.py).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from learner.engine import Learner
from replay.messages import Trajectory


class LearnerWorker:
    def __init__(self, make_learner: Callable[[], Learner], threads: int | None = None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.learner = make_learner()
        self.broadcaster = None  # rank 0 of the weight group, when generators take weights by broadcast

    def train(self, trajectories: Sequence[Trajectory], tag_weights: Mapping[str, float],
              group_weights: Mapping[str, float] | None = None, policy_version: int | None = None,
              partial: bool = False) -> dict[str, Any]:
        out = self.learner.train_batch(trajectories, tag_weights, group_weights, policy_version=policy_version,
                                       allow_partial=partial)
        out["tag_weights"] = dict(tag_weights)
        return out

    def weights(self, dtype: str | None = None):
        """The generator's weights in its ``dtype`` (None: fp32 as trained), put into the object
        store bucket by bucket: rank 0 returns the ``WeightManifest`` (actors/weight_buckets.py),
        the other ranks of a group join the gathers and return None."""
        return self.learner.weight_manifest(dtype)

    def publish(self, out_dir: str, version: int) -> tuple[str, float]:
        """A loadable safetensors snapshot (frozen evaluation snapshots)."""
        path, seconds = self.learner.publish(out_dir, version)
        return str(path), seconds

    def weight_group_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it, for the weight group's store."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def join_weight_group(self, host: str, port: int, world_size: int, backend: str,
                          dtype: str | None = None) -> list[dict[str, Any]]:
        """Form (or re-form, after a generator restart) the broadcast group as
        rank 0; returns the metadata the receivers need, once per model.
        ``dtype``: the generator's; weights are cast to it before sending."""
        import torch

        from learner.weight_broadcast import WeightBroadcaster

        if self.broadcaster is not None:
            self.broadcaster.close()
        cast = getattr(torch, dtype) if dtype else None
        self.broadcaster = WeightBroadcaster(host, port, world_size, backend, dtype=cast)
        return [m.to_wire() for m in self.learner.weight_metadata(cast)]

    def broadcast_weights(self) -> float:
        if self.broadcaster is None:
            raise RuntimeError("broadcast_weights before join_weight_group")
        return self.learner.broadcast_weights(self.broadcaster)

    def save_checkpoint(self, path: str, extra: Mapping[str, Any]) -> str:
        return str(self.learner.save_checkpoint(path, extra))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.learner.load_checkpoint(path)

    def pid(self) -> int:
        return os.getpid()
