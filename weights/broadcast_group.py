"""Weights from the learner to vLLM workers by broadcast over a group of their own.

The OpenRLHF/verl arrangement: the learner's rank 0 and the vLLM workers form
a group apart from both DeepSpeed's training group and vLLM's tensor-parallel
group; the learner is rank 0, the workers ranks 1..N. Nothing here calls
``torch.distributed.init_process_group``: the default group of either process
stays whatever DeepSpeed or vLLM made it.

- NCCL (CUDA): vLLM's ``StatelessProcessGroup`` (a TCPStore) for the
  rendezvous and a ``PyNcclCommunicator`` for the data.
- gloo (CPU): a ``ProcessGroupGloo`` built directly on a TCPStore. Its own
  ``broadcast`` method takes the root in group numbering;
  ``torch.distributed.broadcast`` would map a global rank through the default
  group, which this group is not registered in.

One round: the caller gives every worker the metadata (name, dtype, shape of
each tensor in sending order) while rank 0 broadcasts the tensors in that
order. Every operation is bounded (``WeightGroup``'s watchdog): a member gone
or stalled ends the round on every side with ``WeightGroupError`` naming the
members, and the group must be re-formed. The worker side (receive into fresh buffers,
feed vLLM's in-place reload bucket by bucket, re-derive a tied CPU lm_head) is
actors/generation/weight_worker.py; the learner's side is learner/weight_broadcast.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch  # noqa: TID253 - this module is itself in banned-module-level-imports: imported lazily

from weights.netif import use_node_interface

_STORE_PREFIX = "seal-weight-sync"
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class WeightMeta:
    """One tensor of a broadcast round, as the receiver must allocate it."""

    name: str  # checkpoint (HF) name, what the model's load_weights expects
    dtype: str  # torch dtype without the "torch." prefix, e.g. "float32"
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"{self.name}: unknown dtype {self.dtype!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @classmethod
    def of(cls, name: str, shape: Iterable[int], dtype: torch.dtype) -> WeightMeta:
        return cls(name, str(dtype).removeprefix("torch."), tuple(shape))

    def to_wire(self) -> dict[str, Any]:
        # vLLM's multiprocess RPC encodes with msgpack: plain dicts cross it,
        # dataclasses only with VLLM_ALLOW_INSECURE_SERIALIZATION.
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: WeightMeta | Mapping[str, Any]) -> WeightMeta:
        return obj if isinstance(obj, WeightMeta) else cls(obj["name"], obj["dtype"], tuple(obj["shape"]))


def weight_metadata(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[WeightMeta]:
    return [WeightMeta.of(name, t.shape, t.dtype) for name, t in named_tensors]


def _resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        # PyNcclCommunicator compares devices exactly: "cuda" != "cuda:0".
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


OP_TIMEOUT_S = 120.0  # one tensor of a round once the round is under way (the first waits the group timeout)
# Rank 0 waits for every receiver's "ready for round v" at most this share of the group timeout:
# under ZeRO-3 the other learner ranks wait for rank 0 in a bucket gather bounded by that same
# timeout (the training group's), so rank 0 must give up on a silent receiver well before it.
READY_FRACTION = 0.5
_MEMBER_KEY = "seal-weight-member/"  # rank -> who holds it, for errors that name the members
_READY_KEY = "seal-weight-ready/"  # round/rank: that receiver drained and is receiving round v
_ABORT_KEY = "seal-weight-abort/"  # round: rank 0 gave it up (why); the receivers' watchdogs read it
ABORT_POLL_S = 0.25  # how often a receiver's wait reads the store for rank 0's word


def _abort_gloo(holder: list) -> None:
    pg = holder.pop()
    pg.abort()
    del pg  # the group's destructor runs here, not on the caller's thread


class WeightGroupError(RuntimeError):
    """A broadcast round failed: a member gone or stalled, or the group closed. The group is
    aborted and refuses further rounds; the caller re-forms it (a new group, every member)."""


class WeightGroup:
    """One member of the weight group; ``broadcast`` sends from rank 0 and fills the buffer elsewhere.

    The constructor blocks until all ``world_size`` members have joined, so
    rank 0 and the workers must open it concurrently (rank 0 hosts the store);
    at most ``timeout_s``, then ``WeightGroupError``: gloo's rendezvous waits are
    bounded by it, and on NCCL the communicator is formed non-blocking and
    polled (weights/nccl_comm.py; vLLM's own init and warm-up have no bound).

    Every operation has a bound (the watchdog torch's own NCCL groups have and
    vLLM's PyNccl communicator lacks): the first of a round (``begin_round``)
    waits up to ``timeout_s``, since members may still be finishing other work
    (a replica draining its requests, a learner rank its previous call); each
    later one ``op_timeout_s``. On NCCL the host polls the operation's CUDA event
    and NCCL's asynchronous error (a peer gone over a network transport is seen at
    once; over NVLink only the bound sees it); on gloo a peer gone is an error at
    once and the bound is gloo's per-operation timeout. Either way the group is
    aborted and the error names the operation and the members (each writes who
    it is into the store at join: ``label``).

    When rank 0 gives a round up (a silent receiver at its ready wait, a failed
    send) it also says so in the store, under the round's abort key, before it
    aborts: NCCL over NVLink or shared memory reports no peer's abort, and the
    receivers that were ready would otherwise wait out their bound (``timeout_s``,
    paused) and be restarted as hung. Every receiver's wait reads that key every
    ``ABORT_POLL_S`` and ends the round with rank 0's reason; a store that no longer
    answers (rank 0's process gone) ends it too.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        device: str | torch.device,
        timeout_s: float,  # learner.timeout_s: every join and round (configs/learner/base/learner.yaml)
        op_timeout_s: float = OP_TIMEOUT_S,
        label: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 2 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        if timeout_s <= 0 or op_timeout_s <= 0:
            raise ValueError(f"timeouts must be > 0, got timeout_s={timeout_s}, op_timeout_s={op_timeout_s}")
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s, self.op_timeout_s = float(timeout_s), min(float(op_timeout_s), float(timeout_s))
        self.device = _resolve_device(device)
        self._failed: str | None = None
        self._first = True  # the next operation starts a round
        self._round = 0  # rounds begun: receivers and rank 0 count alike (a failed round aborts the group)
        self._ready = False  # rank 0: every receiver said it is ready for this round
        self._comm: Any = None  # vLLM's PyNcclCommunicator (nccl)
        self._pg: Any = None  # torch's ProcessGroupGloo (gloo)
        self._store: Any = None  # the rendezvous store, borrowed
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"nccl needs a CUDA device, got {self.device}")
        try:
            self._form(host, port, rank, world_size, backend, float(timeout_s))
        except WeightGroupError:
            raise
        except Exception as exc:  # gloo's store waits and NCCL's init are bounded by timeout_s: say which group
            self._abort()
            raise WeightGroupError(
                f"forming the weight group ({backend}, rank {rank} of {world_size}, bound {timeout_s:.0f} s) "
                f"failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}. A member is gone or stalled"
            ) from exc
        if rank != 0:
            # A receiver's reads of rank 0's store (the abort key) must not hang its watchdog on a host
            # gone silent: each store operation from here on waits at most this long.
            store: Any = self._store  # set by _form
            store.set_timeout(timedelta(seconds=min(self.op_timeout_s, 10.0)))
        self._announce(label)

    def _form(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
        if backend == "gloo":
            from torch.distributed import PrefixStore, TCPStore
            from torch.distributed.distributed_c10d import ProcessGroupGloo

            use_node_interface()  # reachable from the other nodes, not the hostname's 127.0.0.1 (weights/netif.py)
            timeout = timedelta(seconds=timeout_s)
            store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
            self._store = store  # the group only borrows it
            self._pg = ProcessGroupGloo(PrefixStore(_STORE_PREFIX, store), rank, world_size, timeout)
        else:
            from vllm.distributed.utils import StatelessProcessGroup

            from weights.nccl_comm import bounded_communicator

            pg = StatelessProcessGroup.create(
                host=host, port=port, rank=rank, world_size=world_size, store_timeout=int(timeout_s)
            )
            self._store = pg.store
            # Formed non-blocking within the timeout (vLLM's blocking init and warm-up had no bound:
            # weights/nccl_comm.py), then a warm-up broadcast under the same watchdog as every round's.
            self._comm = bounded_communicator(pg, self.device, timeout_s)
            self._nccl_broadcast(torch.zeros(1, device=self.device), "the group's warm-up", self.timeout_s)

    # ------------------------------------------------------------ members
    def _announce(self, label: str | None) -> None:
        if self.rank == 0 or self._store is None:
            return
        who = label or f"pid {os.getpid()} on {socket.gethostname()}"
        try:
            self._store.set(f"{_MEMBER_KEY}{self.rank}", who)
        except Exception:  # naming is for error messages only; a store hiccup must not fail the join
            pass

    def members(self) -> dict[int, str]:
        """rank -> who (as each member announced itself; members that did not are left out)."""
        out: dict[int, str] = {}
        if self._store is None:
            return out
        for r in range(1, self.world_size):
            key = f"{_MEMBER_KEY}{r}"
            try:
                if self._store.check([key]):
                    out[r] = self._store.get(key).decode()
            except Exception:
                break  # the store went with rank 0
        return out

    def describe(self) -> str:
        named = self.members()
        listed = "; ".join(f"rank {r}: {named.get(r, '(not announced)')}" for r in range(1, self.world_size))
        return f"weight group ({self.backend}, rank {self.rank} of {self.world_size}; receivers {listed})"

    # -------------------------------------------------------------- rounds
    @property
    def ready_timeout_s(self) -> float:
        return self.timeout_s * READY_FRACTION

    def begin_round(self) -> None:
        """The next operation starts a round. A receiver says so in the store (it has drained and
        is about to receive); rank 0 waits for every receiver's word, at most ``ready_timeout_s``,
        and fails the round (``WeightGroupError``, group aborted) without sending when one is
        silent. A receiver's first operation may then wait up to ``timeout_s``; rank 0's, with
        every receiver there, ``op_timeout_s`` (the learner ranks beside it wait in a gather)."""
        if self._failed is not None:
            raise WeightGroupError(f"{self._failed}; the group was aborted: re-form it before another round")
        self._round += 1
        self._first, self._ready = True, False
        if self._store is None:
            return
        if self.rank != 0:
            try:
                self._store.set(f"{_READY_KEY}{self._round}/{self.rank}", "1")
            except Exception as exc:  # the store lives in rank 0's process: rank 0 is gone
                self._fail(f"round {self._round}'s start", self.timeout_s, f"store unreachable: {exc}")
            return
        keys = {r: f"{_READY_KEY}{self._round}/{r}" for r in range(1, self.world_size)}
        try:
            self._store.wait(list(keys.values()), timedelta(seconds=self.ready_timeout_s))
        except Exception:
            silent = [r for r, key in keys.items() if not self._ready_key(key)]
            self._fail(
                f"round {self._round}'s start",
                self.ready_timeout_s,
                f"receiver rank(s) {silent or '?'} never said they were ready; nothing was sent",
            )
        self._ready = True

    def _ready_key(self, key: str) -> bool:
        try:
            return bool(self._store.check([key]))
        except Exception:
            return False

    def broadcast(self, tensor: torch.Tensor, what: str = "") -> None:
        """Send (rank 0) or receive ``tensor``; ``what`` names it in errors."""
        if self._failed is not None:
            raise WeightGroupError(f"{self._failed}; the group was aborted: re-form it before another round")
        if self._pg is None and self._comm is None:
            raise WeightGroupError("broadcast on a closed weight group")
        if tensor.device != self.device:
            raise ValueError(f"tensor is on {tensor.device}, the group works on {self.device}")
        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor")
        if self._round == 0:  # a caller that never began a round: its first operation begins one
            self.begin_round()
        bound = self.timeout_s if self._first and not self._ready else self.op_timeout_s
        self._first = False
        if self.backend == "gloo":
            from torch.distributed import BroadcastOptions

            opts = BroadcastOptions()
            opts.rootRank = 0
            opts.timeout = timedelta(seconds=bound)
            work = self._pg.broadcast([tensor], opts)
            self._wait(work.is_completed, lambda: None, what, bound, time.monotonic() + bound + 5.0)  # gloo's first
            try:
                work.wait()
            except RuntimeError as exc:  # rank 0's reason, where it gave the round up, says more than gloo's
                word = self._rank0_gave_up(store_gone=False) if self.rank != 0 else None
                self._fail(what, bound, word or str(exc).splitlines()[0])
        else:
            self._nccl_broadcast(tensor, what, bound)

    def _nccl_broadcast(self, tensor: torch.Tensor, what: str, bound: float) -> None:
        """Queue the broadcast on the current stream and wait for it within ``bound``. The communicator
        is non-blocking (weights/nccl_comm.py): NCCL may answer ncclInProgress and queue the kernel
        only once its state leaves it, so the CUDA event is recorded after that."""
        from weights.nccl_comm import NCCL_IN_PROGRESS, NCCL_SUCCESS, broadcast, state

        deadline = time.monotonic() + bound
        stream = torch.cuda.current_stream(self.device)
        result = broadcast(self._comm, tensor, 0, stream)
        if result not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            self._fail(what, bound, f"ncclBroadcast returned {result}")

        def queued() -> bool:
            return state(self._comm.nccl, self._comm.comm) != NCCL_IN_PROGRESS

        self._wait(queued, lambda: None, what, bound, deadline)
        cause = self._nccl_async_error()
        if cause:
            self._fail(what, bound, f"NCCL reported {cause}")
        done = torch.cuda.Event()
        done.record(stream)
        self._wait(done.query, self._nccl_async_error, what, bound, deadline)

    def _wait(
        self, finished: Callable[[], bool], error: Callable[[], object], what: str, bound: float, deadline: float
    ) -> None:
        """Wait for the operation just queued (``finished()``) until ``deadline`` (monotonic; ``bound``
        seconds from its start), watching ``error()`` (NCCL's asynchronous error) and, on a receiver,
        rank 0's word that it gave the round up."""
        next_read = time.monotonic() + ABORT_POLL_S
        pause = 1e-4
        while not finished():
            cause = error()
            if cause:
                self._fail(what, bound, f"NCCL reported {cause}")
            now = time.monotonic()
            if now > deadline:
                self._fail(what, bound, f"not complete within {bound:.0f} s")
            if self.rank != 0 and now >= next_read:
                word = self._rank0_gave_up()
                if word:
                    self._fail(what, bound, word)
                next_read = time.monotonic() + ABORT_POLL_S
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _rank0_gave_up(self, store_gone: bool = True) -> str | None:
        """Rank 0's word that it gave this round up (its reason), or (``store_gone``) that its store,
        which lives in rank 0's process, no longer answers."""
        key = f"{_ABORT_KEY}{self._round}"
        try:
            if not self._store.check([key]):
                return None
            return f"rank 0 gave round {self._round} up: {self._store.get(key).decode()}"
        except Exception as exc:
            return f"rank 0's store does not answer ({type(exc).__name__})" if store_gone else None

    def _nccl_async_error(self) -> str | None:
        """NCCL's asynchronous error on the communicator (a peer's connection lost), or None;
        None also where the library does not expose it."""
        from weights.nccl_comm import NCCL_IN_PROGRESS, NCCL_SUCCESS, error_string, state

        try:
            code = state(self._comm.nccl, self._comm.comm)
        except (AttributeError, OSError):
            return None
        return None if code in (NCCL_SUCCESS, NCCL_IN_PROGRESS) else error_string(self._comm.nccl, code)

    def _fail(self, what: str, bound: float, cause: str) -> None:
        """Abort the group (pending operations end; the other members see their peer gone) and raise."""
        self._failed = (
            f"{self.describe()}: broadcast of {what or 'a tensor'} failed "
            f"(bound {bound:.0f} s): {cause}. A member is gone or stalled"
        )
        if self.rank == 0 and self._store is not None:
            try:  # the receivers' watchdogs read it (the class docstring); the store is in this process
                self._store.set(f"{_ABORT_KEY}{self._round}", f"{what or 'a tensor'}: {cause}")
            except Exception:
                pass
        self._abort()
        raise WeightGroupError(self._failed)

    def _abort(self) -> None:
        comm, pg = self._comm, self._pg
        self._comm = self._pg = None
        if comm is not None:
            comm.destroy()  # ncclCommAbort in a bounded thread (weights/nccl_comm.py)
        if pg is not None:
            # Dropping a gloo group waits for an operation still pending (a receive rank 0 will never
            # feed, when its word in the store ended the round) until that operation's own bound: the
            # abort, and the last reference, go to a thread of their own.

            holder = [pg]
            del pg
            threading.Thread(target=_abort_gloo, args=(holder,), daemon=True, name="seal-gloo-abort").start()

    def synchronize(self) -> None:
        """NCCL calls only enqueue work; wait for it (timing, or handing buffers to another stream)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """End this member's part: the communicator's resources go now, not whenever the garbage collector runs."""
        if self._comm is not None:
            self._comm.destroy()
        if self._pg is not None:
            self._pg.shutdown()
        self._comm = self._pg = self._store = None

    @property
    def closed(self) -> bool:
        return self._comm is None and self._pg is None
