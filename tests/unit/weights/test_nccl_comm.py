"""weights/nccl_comm.py: the weight group's NCCL communicator formed non-blocking within a bound
(issue 46 item 8).

NCCL cannot run here (no GPU, no libnccl), so what a CPU can check is checked: the config handed to
``ncclCommInitRankConfig`` against nccl.h's ``ncclConfig_t`` (its leading fields, as NCCL's
``parseCommConfig`` reads them: up to ``size``, fields newer than ``version`` left at its defaults), and
the control flow of the bounded init over a stand-in for the library's four calls (it answers as NCCL
documents for a non-blocking communicator: ncclInProgress until ready, or an error). The GPU row of
scripts/gpu_check.sh forms the real group.
"""

from __future__ import annotations

import ctypes
import time

import pytest

from weights.nccl_comm import (
    NCCL_IN_PROGRESS,
    NCCL_SUCCESS,
    NcclConfig,
    NcclStateError,
    init_nonblocking,
    nonblocking_config,
)


def test_the_config_is_ncclconfig_ts_leading_fields_of_nccl_2_14_asking_for_non_blocking():
    # nccl.h: size_t size; unsigned int magic; unsigned int version; int blocking; ...
    assert [(name, getattr(NcclConfig, name).offset) for name, _ in NcclConfig._fields_] == [
        ("size", 0),
        ("magic", 8),
        ("version", 12),
        ("blocking", 16),
    ]
    config = nonblocking_config()
    assert config.size == ctypes.sizeof(NcclConfig) == 24  # NCCL copies this much over its defaults
    assert config.magic == 0xCAFEBEEF  # NCCL_API_MAGIC: anything else is ncclInvalidArgument
    assert config.version == 2 * 10000 + 14 * 100  # NCCL_VERSION(2, 14, 0): blocking is read, newer fields reset
    assert config.blocking == 0


class StandInNccl:
    """The four calls the bounded init makes, answering as a non-blocking communicator does."""

    def __init__(self, states: list[int], first: int = NCCL_IN_PROGRESS) -> None:
        self.states, self.first = list(states), first
        self.calls: list[str] = []
        self.config: tuple[int, int, int, int] | None = None
        self.lib = self
        # a function (the init's argtypes are set on it), as a CDLL's are
        self.ncclCommInitRankConfig = lambda *args: self._init(*args)

    def _init(self, comm_ref, nranks, unique_id, rank, config_ref):
        self.calls.append("init")
        c = config_ref._obj
        self.config = (c.size, c.magic, c.version, c.blocking)
        comm_ref._obj.value = 0x1234  # the handle exists at once; its state says when it is ready
        return self.first

    def ncclCommGetAsyncError(self, comm, result_ref):
        result_ref._obj.value = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return NCCL_SUCCESS

    def ncclCommAbort(self, comm):
        self.calls.append("abort")
        return NCCL_IN_PROGRESS  # a non-blocking abort may finish in the background: no error

    def ncclGetErrorString(self, code):
        return {2: "unhandled system error", 6: "remote process exited or there was a network error"}.get(code, "?")


def unique_id():
    from vllm.distributed.device_communicators.pynccl_wrapper import ncclUniqueId

    return ncclUniqueId()


def test_an_init_that_gets_ready_returns_the_communicator():
    nccl = StandInNccl([NCCL_IN_PROGRESS, NCCL_IN_PROGRESS, NCCL_SUCCESS])
    comm = init_nonblocking(nccl, 3, unique_id(), 1, timeout_s=5.0)
    assert comm.value == 0x1234 and nccl.calls == ["init"]
    assert nccl.config == (24, 0xCAFEBEEF, 21400, 0)


def test_an_init_still_in_progress_at_the_bound_is_aborted_and_raises_in_time():
    """A member that never joins NCCL (failed after the store's rendezvous): before, the blocking
    ncclCommInitRank waited for ever; now the join ends at the bound with the communicator aborted."""
    nccl = StandInNccl([NCCL_IN_PROGRESS])
    t0 = time.monotonic()
    with pytest.raises(NcclStateError, match="not ready in time"):
        init_nonblocking(nccl, 3, unique_id(), 2, timeout_s=0.5)
    assert 0.5 <= time.monotonic() - t0 < 3.0
    assert nccl.calls == ["init", "abort"]


def test_an_init_that_fails_is_aborted_and_names_ncclss_error():
    nccl = StandInNccl([NCCL_IN_PROGRESS, 6])
    with pytest.raises(NcclStateError, match="remote process exited"):
        init_nonblocking(nccl, 2, unique_id(), 0, timeout_s=5.0)
    assert nccl.calls == ["init", "abort"]
    refused = StandInNccl([NCCL_SUCCESS], first=2)
    with pytest.raises(NcclStateError, match="unhandled system error"):
        init_nonblocking(refused, 2, unique_id(), 0, timeout_s=5.0)
