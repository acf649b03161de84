"""learner/collectives.py: the learner's collectives use tensors on the device the group's backend
serves (NCCL: CUDA only), and no collective in learner/ or seal/ bypasses it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from learner.collectives import device_for_backend

ROOT = Path(__file__).resolve().parents[3]
# torch.distributed calls that move tensors between ranks (not queries like get_rank).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)


@pytest.mark.parametrize(
    "backend, device",
    [("gloo", "cpu"), ("nccl", "cuda:3"), ("cpu:gloo,cuda:nccl", "cpu"), ("NCCL", "cuda:3"), ("cuda:nccl", "cuda:3")],
)
def test_each_backend_gets_tensors_on_the_device_it_serves(backend, device):
    assert device_for_backend(backend, cuda_index=3) == device


def test_an_unknown_backend_is_refused_before_any_tensor_is_made():
    with pytest.raises(ValueError, match="no device known for process-group backend 'hccl'"):
        device_for_backend("hccl")


def test_no_collective_in_learner_or_seal_bypasses_the_device_choice():
    """The fault this guards against: ``agree_on_mini_batches`` all-reduced CPU tensors over an NCCL group
    (every multi-rank GPU step failed at its first collective)."""
    call = re.compile(r"\b(?:dist|torch\.distributed)\.(" + "|".join(COLLECTIVES) + r")\(")
    found = []
    for package in ("learner", "seal"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "learner" / "collectives.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if call.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "collectives outside learner/collectives.py:\n" + "\n".join(found)


def _reduce_in_group(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    from learner.collectives import all_reduce_values

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out.put(
            (rank, all_reduce_values([rank + 1, 2.0**40 + rank], "sum"), all_reduce_values([rank, 7 - rank], "max"))
        )
    finally:
        dist.destroy_process_group()


def test_values_are_reduced_over_a_real_gloo_group():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reduce_in_group, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for _, sums, most in got:
        assert sums == [3.0, 2.0**41 + 1] and most == [1.0, 7.0]  # float64: 2**41 + 1 is exact


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NCCL)")
def test_values_are_reduced_over_an_nccl_group_of_one():
    """On the old code this raised "No backend type associated with device type cpu"."""
    import socket

    import torch.distributed as dist

    from learner.collectives import all_reduce_values

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert all_reduce_values([1, 2], "sum") == [1.0, 2.0]
    finally:
        dist.destroy_process_group()
