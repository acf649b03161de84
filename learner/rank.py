"""One rank of the learner group as a Ray actor (the driver side is seal/runtime/learner_group.py).

Built in two calls so the group can meet where rank 0 runs: the actor starts
empty, rank 0 reports its node's address and a free port there, then every
rank joins the torch.distributed group and builds its Learner (DeepSpeed finds
the group formed). Every method that touches the model or a process group is a
collective under ZeRO-3: the driver calls it on all ranks at once, with a ticket
per rank, and the rank runs those calls one at a time in ticket order
(learner/call_order.py). Probes (``node``, ``pid``, ``address``) take no ticket:
they must answer while a step runs.

Weights leave through Ray's object store in buckets (weights/buckets.py),
or over the weight group by broadcast (learner/weight_broadcast.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from learner.call_order import CallOrder
from learner.engine import Learner
from learner.onednn_caches import bound_caches
from learner.rank_shards import RankShard, Rendezvous, join_group
from learner.step_result import LearnerStepResult
from learner.torch_thread import TorchThread

if TYPE_CHECKING:
    from learner.weight_broadcast import WeightBroadcaster


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the symbols already loaded in this process (None off glibc), looked
    up once: ctypes.util.find_library would run ldconfig on every call."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def _release_free_memory() -> None:
    """Hand the heap's free pages back to the OS after a step (glibc only; a no-op elsewhere).
    Each step's activations come in new shapes, and glibc keeps what they freed: without this
    the CPU default's learner grew from 8 to 15 GB over ten steps and Ray's OOM killer took the
    generator beside it."""
    if (trim := _malloc_trim()) is not None:
        trim(0)


def _set_torch_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _free_port_here() -> tuple[str, int]:
    """This node's IP (never loopback: other nodes must reach it) and a free port on it."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return _node_ip(), sock.getsockname()[1]


class LearnerRank:
    def __init__(self, threads: int | None = None) -> None:  # the learner comes in start
        bound_caches()  # this process's first torch use is below: before any bf16 op (learner/onednn_caches.py)
        # Every ordered call's body runs on this one thread (learner/torch_thread.py); torch's thread
        # count is that thread's setting, so it is set there.
        self.torch = TorchThread("learner-torch", initializer=functools.partial(_set_torch_threads, threads))
        self.learner: Learner | None = None
        # Rank 0 of the weight group, when generators take weights by broadcast.
        self.broadcaster: WeightBroadcaster | None = None
        self.rank = -1
        self.order = CallOrder(f"learner pid {os.getpid()}")
        self.wait_s = 3600.0  # how long a call waits for the one before it: the group's step timeout, set in start

    def _started(self) -> Learner:
        """This rank's learner; an ordered call before ``start`` built it is the driver's mistake."""
        if self.learner is None:
            raise RuntimeError(f"{self.order.name}: called before start built its learner")
        return self.learner

    # ------------------------------------------------------------------ probes (no ticket)
    def address(self) -> tuple[str, int]:
        return _free_port_here()

    def node(self) -> dict[str, Any]:
        import ray

        return {
            "ip": _node_ip(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def pid(self) -> int:
        return os.getpid()

    def next_ticket(self) -> int:
        """The ticket whose turn it is (the driver waits for the weight group's join to be running)."""
        return self.order.next_ticket

    def weight_group_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it, for the weight group's store."""
        return _free_port_here()

    # ------------------------------------------------------------------ ordered calls
    def start(self, ticket: int, rendezvous: Rendezvous, make_learner: Callable[[], Learner]) -> int:
        """Join the group and build this rank's learner; returns its rank."""
        self.order.name = f"learner rank {rendezvous.rank} on node {_node_ip()}"
        self.wait_s = rendezvous.wait_s
        with self.order.turn(ticket, "start", self.wait_s):
            if rendezvous.world_size > 1:
                self.torch.run(join_group, rendezvous)
            self.learner = self.torch.run(make_learner)
            if self.learner.world_size != rendezvous.world_size:
                raise ValueError(
                    f"the learner was configured for world_size={self.learner.world_size}, the group has {rendezvous.world_size}"
                )
            self.rank = rendezvous.rank
            return self.rank

    def train_shard(
        self,
        ticket: int,
        shard: RankShard,
        tag_weights: Mapping[str, float],
        group_weights: Mapping[str, float] | None,
        policy_version: int | None,
    ) -> LearnerStepResult:
        with self.order.turn(ticket, "train step", self.wait_s):
            out = self.torch.run(
                self._started().train_batch,
                shard.trajectories,
                tag_weights,
                group_weights,
                policy_version=policy_version,
                mini_groups=shard.mini_groups,
            )
            _release_free_memory()
            return replace(out, tag_weights=dict(tag_weights))

    def canary_logprobs(self, ticket: int, token_ids: list[int]) -> list[float]:
        with self.order.turn(ticket, "weight canary", self.wait_s):
            return self.torch.run(self._started().canary_logprobs, token_ids)

    def weights(self, ticket: int, dtype: str | None = None):
        """The generator's weights in its ``dtype`` (None: fp32 as trained), put into the object
        store bucket by bucket: rank 0 returns the ``WeightManifest`` (weights/buckets.py),
        the other ranks of a group join the gathers and return None."""
        with self.order.turn(ticket, "weight gather", self.wait_s):
            return self.torch.run(self._started().weights_out.weight_manifest, dtype)

    def save_snapshot(self, ticket: int, out_dir: str, version: int) -> tuple[str, float]:
        """A loadable safetensors snapshot (frozen evaluation snapshots)."""
        with self.order.turn(ticket, "snapshot", self.wait_s):
            learner = self._started()
            path, seconds = self.torch.run(learner.weights_out.save_snapshot, out_dir, version, learner.step)
            _release_free_memory()
            return str(path), seconds

    def join_weight_group(
        self, ticket: int, host: str, port: int, world_size: int, backend: str, dtype: str | None = None
    ) -> list[dict[str, Any]]:
        """Form (or re-form, after a generator restart) the broadcast group as rank 0; returns the
        metadata the receivers need, once per model. ``dtype``: the generator's; weights are cast to
        it before sending. Ordered: a broadcast still running must finish before its group is replaced."""
        import torch

        from learner.weight_broadcast import WeightBroadcaster

        def form() -> list[dict[str, Any]]:
            if self.broadcaster is not None:
                self.broadcaster.close()
                self.broadcaster = None
            cast = getattr(torch, dtype) if dtype else None
            self.broadcaster = WeightBroadcaster(
                host, port, world_size, backend, dtype=cast, timeout_s=self._started().timeout_s
            )
            return [m.to_wire() for m in self._started().weights_out.weight_metadata(cast)]

        with self.order.turn(ticket, "weight group", self.wait_s):
            return self.torch.run(form)

    def broadcast_weights(self, ticket: int) -> float:
        """Rank 0 sends over the weight group; the other ranks only join the ZeRO-3 bucket gathers."""
        with self.order.turn(ticket, "weight broadcast", self.wait_s):
            if self.rank == 0 and self.broadcaster is None:
                raise RuntimeError("broadcast_weights before join_weight_group")
            return self.torch.run(
                self._started().weights_out.broadcast_weights, self.broadcaster if self.rank == 0 else None
            )

    def save_checkpoint(self, ticket: int, path: str, extra: Mapping[str, Any], keep: int = 0) -> str:
        with self.order.turn(ticket, "checkpoint", self.wait_s):
            saved = str(self.torch.run(self._started().save_checkpoint, path, extra, keep))
            _release_free_memory()
            return saved

    def load_checkpoint(self, ticket: int, path: str) -> dict[str, Any]:
        with self.order.turn(ticket, "resume", self.wait_s):
            return self.torch.run(self._started().load_checkpoint, path)

    def param_share(self, ticket: int) -> dict[str, int]:
        """Parameters this rank holds, from the partitioned tensors (ZeRO-3: ds_tensor), against the
        model's full count (ds_numel); the reference model's too (0 and 0: none)."""

        def count(module) -> tuple[int, int]:
            held = total = 0
            for p in module.parameters():
                held += p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                total += getattr(p, "ds_numel", p.numel())
            return held, total

        with self.order.turn(ticket, "parameter count", self.wait_s):  # reads sizes only: no torch op
            learner = self._started()
            held, total = count(learner.model)
            ref = learner.ref
            ref_held, ref_total = count(getattr(ref, "module", ref)) if ref is not None else (0, 0)
            return {"held": held, "total": total, "ref_held": ref_held, "ref_total": ref_total}

    # ------------------------------------------------------------ profiling (seal bench learner-scale)
    def comm_profile(self, ticket: int, enabled: bool) -> None:
        """DeepSpeed's comms logger on or off, its records cleared (it times each collective call)."""
        import deepspeed.comm as dscomm
        from deepspeed.comm.comm import comms_logger

        with self.order.turn(ticket, "comm profile", self.wait_s):
            dscomm.configure(enabled=enabled, prof_all=enabled)
            comms_logger.comms_dict = {}

    def comm_seconds(self, ticket: int) -> float:
        from deepspeed.comm.comm import comms_logger

        with self.order.turn(ticket, "comm profile", self.wait_s):
            return sum(sum(rec[1]) for sizes in comms_logger.comms_dict.values() for rec in sizes.values()) / 1000.0

    def peak_memory_gb(self) -> float:
        """Peak device memory under CUDA, else this process's peak resident set (VmHWM). A probe."""
        import torch

        if torch.cuda.is_available() and self.learner is not None and self.learner.cfg.device == "cuda":
            return torch.cuda.max_memory_allocated() / 2**30
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20
