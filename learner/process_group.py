"""The learner's process group: the one-process rendezvous a lone learner forms for DeepSpeed (and
destroys when the last learner on it closes), and what DeepSpeed's comm backend must not do on
start (learner/rank_shards.py forms multi-rank groups)."""

from __future__ import annotations

import importlib
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


# Learners of this process on the default group init_distributed formed (0: it formed none, or it
# is gone). The last one's close destroys the group: left behind, it made the next
# init_process_group in the process (a later learner on another device, an NCCL test under
# `pytest -m gpu`) raise "trying to initialize the default process group twice".
_users = 0


def init_distributed(device: str) -> bool:
    """A one-process group unless a launcher (deepspeed/torchrun) already set one up. True when the
    caller now shares a group this module formed, and must ``release_distributed`` it when done."""
    import torch.distributed as dist

    global _users
    skip_inference_shm_op()  # before any DeepSpeed comm backend exists (deepspeed.initialize makes one too)
    if dist.is_initialized():
        # Someone (a launcher, the learner group's join_group, vLLM in the same process, or an
        # earlier learner here) made the group; DeepSpeed still reads the rank variables.
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
        os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
        if _users:
            _users += 1
        return bool(_users)
    import deepspeed

    _users = 0  # a group formed here and destroyed by someone else: no learner holds it any more
    if "MASTER_PORT" in os.environ and "RANK" in os.environ:  # a launcher's rendezvous (torchrun, deepspeed)
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
        _users = 1
        return True
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
    _users = 1
    return True


def release_distributed() -> None:
    """One learner done with the group ``init_distributed`` formed; the last one destroys it, with
    DeepSpeed's references to it, so the process can form another (never a group made elsewhere)."""
    import torch.distributed as dist

    global _users
    if _users == 0:
        return
    _users -= 1
    if _users == 0 and dist.is_initialized():
        # The module, not the package: the package's ``cdb`` is a copy taken at import (None).
        ds_comm = importlib.import_module("deepspeed.comm.comm")
        if ds_comm.cdb is not None:
            ds_comm.destroy_process_group()  # also drops DeepSpeed's cached groups (its world clone)
        else:
            dist.destroy_process_group()
