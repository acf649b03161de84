"""The learner's own collectives over the training group, on the device its backend serves.

torch's NCCL backend serves CUDA tensors only: an all-reduce of a CPU tensor over an NCCL group
fails ("No backend type associated with device type cpu"). gloo serves CPU tensors (and CUDA ones
by a host copy). So every tensor a collective here touches is made on ``collective_device()``, and
every ``torch.distributed`` collective in learner/ and seal/ goes through this module
(tests/unit/test_learner_collectives.py reads the sources to keep it so). DeepSpeed's own
collectives (ZeRO) place their tensors themselves.
"""

from __future__ import annotations

from collections.abc import Sequence


def device_for_backend(backend: str, cuda_index: int = 0) -> str:
    """The device a process group's ``backend`` serves for small control tensors: CPU where the
    backend has a CPU side (gloo, or a ``cpu:gloo,cuda:nccl`` pair), else the rank's CUDA device."""
    parts = {p.split(":")[0]: p.split(":")[-1] for p in backend.lower().split(",")}
    if "cpu" in parts or backend.lower() in ("gloo", "mpi", "ccl", "ucc"):
        return "cpu"
    if backend.lower() == "nccl" or parts.get("cuda") == "nccl":
        return f"cuda:{cuda_index}"
    raise ValueError(f"no device known for process-group backend {backend!r} (gloo, nccl or cpu:gloo,cuda:nccl)")


def collective_device():
    """``device_for_backend`` of the default (training) group, for this rank's current CUDA device."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    index = torch.cuda.current_device() if "nccl" in backend.lower() else 0
    return torch.device(device_for_backend(backend, index))


def all_reduce_values(values: Sequence[float], op: str, dtype=None) -> list[float]:
    """``values`` reduced element-wise over the training group (``op``: sum | max), back on the host.
    Bounded by the group's timeout (set when it was formed: learner/rank_shards.py join_group)."""
    import torch
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    tensor = torch.tensor(list(values), dtype=dtype or torch.float64, device=collective_device())
    dist.all_reduce(tensor, op=ops[op])
    return tensor.cpu().tolist()
