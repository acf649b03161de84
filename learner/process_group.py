"""The learner's process group: the one-process rendezvous a lone learner forms for DeepSpeed,
and what DeepSpeed's comm backend must not do on start (learner/group.py forms multi-rank groups)."""

from __future__ import annotations

import os
import socket


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skip_inference_shm_op() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory all-reduce op (deepspeed_shm_comm).

    Its comm backend loads the op in every process that starts DeepSpeed comms, yet only
    ``inference_all_reduce`` (DeepSpeed inference) calls it; ZeRO training never does. The load
    runs ninja under a lock file in ~/.cache/torch_extensions, and torch's FileBaton waits on that
    file with no timeout: a process killed inside the window (a test's timeout, a Ray actor kill)
    leaves the file, and every later learner on the machine waits forever. CI hung for an hour
    that way (2026-12-03). DeepSpeed keeps the probe's result in one dict so edits persist."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def init_distributed(device: str) -> None:
    """A one-process group unless a launcher (deepspeed/torchrun) already set one up."""
    import torch.distributed as dist

    skip_inference_shm_op()  # before any DeepSpeed comm backend exists (deepspeed.initialize makes one too)
    if dist.is_initialized():
        # Someone (a launcher, or vLLM in the same process) made the group;
        # DeepSpeed still reads the rank variables.
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
        os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
        return
    import deepspeed

    if "MASTER_PORT" in os.environ and "RANK" in os.environ:  # a launcher's rendezvous (torchrun, deepspeed)
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    # Our own one-process rendezvous: its address lives in the environment only while
    # the group forms. Left there, every process started later from this one (Ray's
    # raylet and workers, a `seal train` subprocess) would inherit the port, which this
    # process's store still holds, and fail with EADDRINUSE.
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    try:
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    finally:
        os.environ.pop("MASTER_ADDR", None)
        os.environ.pop("MASTER_PORT", None)
