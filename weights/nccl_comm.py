"""The weight group's NCCL communicator (weights/broadcast_group.py), formed within a bound.

vLLM's ``PyNcclCommunicator`` forms its communicator with a blocking ``ncclCommInitRank``, then runs a
warm-up all-reduce and a stream synchronize, none of them bounded (vLLM 0.32,
vllm/distributed/device_communicators/pynccl.py, ``_init_comm``): a member that fails after the store's
rendezvous leaves every other member inside NCCL for ever. Here the communicator is created
non-blocking (``ncclCommInitRankConfig`` with ``config.blocking = 0``, NCCL >= 2.14) and its state
(``ncclCommGetAsyncError``) is polled until it is ready, within the group's timeout; past it,
``ncclCommAbort`` ends the init (NCCL's init thread sees the abort flag) and the join fails. vLLM's
warm-up is skipped: the group runs its own, bounded like every broadcast (``WeightGroup``).

A non-blocking communicator stays so: any call may answer ``ncclInProgress`` while NCCL finishes it in
the background (connection setup at a first collective), and vLLM's wrappers raise on anything but
success. So the group's broadcasts go through ``broadcast`` here (the raw call; the caller waits
for the state to leave ``ncclInProgress`` before it records its CUDA event: the kernel is queued
only then), and the close is a raw ``ncclCommAbort`` that accepts ``ncclInProgress`` too.

Only a GPU runs this; each call was read against vLLM 0.32's pynccl.py and pynccl_wrapper.py and
NCCL's nccl.h and init.cc (``parseCommConfig``: a config of an older version is read up to its
``size``, the fields that version lacks left at NCCL's defaults).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from typing import Any

import torch  # noqa: TID253 - this module is itself in banned-module-level-imports: imported lazily

NCCL_SUCCESS, NCCL_IN_PROGRESS = 0, 7  # ncclResult_t
CONFIG_MAGIC = 0xCAFEBEEF  # NCCL_API_MAGIC
CONFIG_VERSION = 21400  # NCCL_VERSION(2, 14, 0): the first with ``blocking``; later fields stay NCCL's defaults
ABORT_WAIT_S = 5.0  # as vLLM's destroy: ncclCommAbort may wait on CUDA graphs released later; never hang a caller


class NcclConfig(ctypes.Structure):
    """The leading fields of ``ncclConfig_t`` (nccl.h), all NCCL 2.14 had: NCCL copies ``size``
    bytes of it over its defaults and, for ``version`` 2.14, resets every field added since."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
    ]


def nonblocking_config() -> NcclConfig:
    return NcclConfig(size=ctypes.sizeof(NcclConfig), magic=CONFIG_MAGIC, version=CONFIG_VERSION, blocking=0)


class NcclStateError(RuntimeError):
    """The communicator failed or did not get ready in time (it has been aborted)."""


def _handle(comm: Any) -> ctypes.c_void_p:
    return comm if isinstance(comm, ctypes.c_void_p) else ctypes.c_void_p(comm)


def state(nccl: Any, comm: Any) -> int:
    """``ncclCommGetAsyncError``: ncclSuccess, ncclInProgress (an init or a call still going on in the
    background) or the communicator's error."""
    result = ctypes.c_int(NCCL_SUCCESS)
    called = nccl.lib.ncclCommGetAsyncError(_handle(comm), ctypes.byref(result))
    return int(called) if called != NCCL_SUCCESS else int(result.value)


def error_string(nccl: Any, code: int) -> str:
    try:
        return str(nccl.ncclGetErrorString(code))
    except Exception:
        return f"NCCL result {code}"


def wait_ready(nccl: Any, comm: Any, deadline: float, what: str) -> None:
    """Poll the communicator's state until it leaves ncclInProgress, by ``deadline`` (monotonic);
    an error or the deadline aborts the communicator and raises ``NcclStateError``."""
    pause = 1e-4
    while True:
        now = state(nccl, comm)
        if now == NCCL_SUCCESS:
            return
        if now != NCCL_IN_PROGRESS:
            abort(nccl, comm)
            raise NcclStateError(f"{what}: NCCL reported {error_string(nccl, now)}")
        if time.monotonic() > deadline:
            abort(nccl, comm)
            raise NcclStateError(f"{what}: not ready in time (NCCL still in progress); aborted")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def init_nonblocking(nccl: Any, world_size: int, unique_id: Any, rank: int, timeout_s: float) -> ctypes.c_void_p:
    """A communicator of ``world_size`` formed within ``timeout_s`` (or ``NcclStateError``, aborted)."""
    from vllm.distributed.device_communicators.pynccl_wrapper import ncclComm_t, ncclUniqueId

    init = nccl.lib.ncclCommInitRankConfig
    init.restype = ctypes.c_int
    init.argtypes = [
        ctypes.POINTER(ncclComm_t),
        ctypes.c_int,
        ncclUniqueId,
        ctypes.c_int,
        ctypes.POINTER(NcclConfig),
    ]
    comm = ncclComm_t()
    config = nonblocking_config()
    deadline = time.monotonic() + float(timeout_s)
    result = init(ctypes.byref(comm), int(world_size), unique_id, int(rank), ctypes.byref(config))
    if result not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
        if comm.value:
            abort(nccl, comm)
        raise NcclStateError(f"ncclCommInitRankConfig (rank {rank} of {world_size}): {error_string(nccl, result)}")
    wait_ready(nccl, comm, deadline, f"forming the NCCL communicator (rank {rank} of {world_size}, {timeout_s:.0f} s)")
    return comm


def abort(nccl: Any, comm: Any, device: torch.device | None = None) -> None:
    """``ncclCommAbort`` in a daemon thread waited on at most ``ABORT_WAIT_S`` (as vLLM's destroy);
    ncclInProgress is no error here (NCCL finishes the abort in the background)."""

    def run() -> None:
        if device is not None and device.type == "cuda":
            with torch.accelerator.device_index(device.index):
                nccl.lib.ncclCommAbort(_handle(comm))
        else:
            nccl.lib.ncclCommAbort(_handle(comm))

    thread = threading.Thread(target=run, daemon=True, name="seal-nccl-abort")
    thread.start()
    thread.join(ABORT_WAIT_S)


def broadcast(comm: Any, tensor: torch.Tensor, src: int, stream: Any) -> int:
    """Queue ``ncclBroadcast`` as vLLM's ``PyNcclCommunicator.broadcast`` does, without its check:
    returns NCCL's result (ncclInProgress: queued once the state leaves it)."""
    from vllm.distributed.device_communicators.pynccl_wrapper import buffer_type, cudaStream_t, ncclDataTypeEnum

    buffer = buffer_type(tensor.data_ptr())
    send = buffer if comm.rank == src else buffer_type()  # NCCL wants a receive buffer on the root too
    return int(
        comm.nccl._funcs["ncclBroadcast"](
            send,
            buffer,
            tensor.numel(),
            ncclDataTypeEnum.from_torch(tensor.dtype),
            src,
            comm.comm,
            cudaStream_t(stream.cuda_stream),
        )
    )


@functools.cache
def _communicator_class() -> Any:
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    class BoundedPyNccl(PyNcclCommunicator):
        """vLLM's communicator (its unique-id exchange over the group's store, bounded by the store's
        timeout) with the init above in place of its blocking one and its unbounded warm-up."""

        def __init__(self, group: Any, device: torch.device, init_timeout_s: float) -> None:
            self.init_timeout_s = float(init_timeout_s)  # read by _init_comm, which vLLM's __init__ calls
            super().__init__(group, device=device)

        def _init_comm(self, device: int | str | torch.device) -> None:
            device = torch.device(f"cuda:{device}") if isinstance(device, int) else torch.device(device)
            self.device = device
            with torch.accelerator.device_index(device.index):
                self.comm = init_nonblocking(self.nccl, self.world_size, self.unique_id, self.rank, self.init_timeout_s)

        def destroy(self) -> None:
            if self.available and not self.disabled:
                abort(self.nccl, self.comm, self.device)
                self.available, self.disabled = False, True

    return BoundedPyNccl


def bounded_communicator(pg: Any, device: torch.device, timeout_s: float) -> Any:
    """vLLM's ``PyNcclCommunicator`` over ``pg`` (a StatelessProcessGroup) on ``device``, formed within
    ``timeout_s`` (``NcclStateError`` past it), non-blocking for the rest of its life."""
    comm = _communicator_class()(pg, device, timeout_s)
    if getattr(comm, "disabled", True):
        raise NcclStateError("vLLM's PyNccl is disabled here (no NCCL library, or VLLM_DISABLE_PYNCCL)")
    return comm
