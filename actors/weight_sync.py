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
members, and the group must be re-formed. A worker receives each into a fresh buffer on its device and feeds
them, a bucket at a time, to vLLM's in-place reload (``reload_weights`` with a
weights iterator), which wraps the model's ``load_weights`` in the layerwise
reload that re-runs weight processing; on CPU a bare ``load_weights`` fails
because the loaded weights are repacked for the CPU kernels.

That reload misses one thing on CPU, whichever way the weights come: a tied
lm_head receives no weights of its own (``load_weights`` skips
``lm_head.weight`` when tied), so it is never re-processed and its GEMM keeps
the weight packed from the old embedding. ``refresh_tied_cpu_weights`` re-derives
it; the generator calls it after every reload (measured on the tiny model
without it: next-token logprobs off by 1.47 from an HF forward of the new weights).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Iterable, Mapping

import torch

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
    def of(cls, name: str, shape: Iterable[int], dtype: torch.dtype) -> "WeightMeta":
        return cls(name, str(dtype).removeprefix("torch."), tuple(shape))

    def to_wire(self) -> dict[str, Any]:
        # vLLM's multiprocess RPC encodes with msgpack: plain dicts cross it,
        # dataclasses only with VLLM_ALLOW_INSECURE_SERIALIZATION.
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: "WeightMeta | Mapping[str, Any]") -> "WeightMeta":
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
_MEMBER_KEY = "seal-weight-member/"  # rank -> who holds it, for errors that name the members


class WeightGroupError(RuntimeError):
    """A broadcast round failed: a member gone or stalled, or the group closed. The group is
    aborted and refuses further rounds; the caller re-forms it (a new group, every member)."""


class WeightGroup:
    """One member of the weight group; ``broadcast`` sends from rank 0 and fills the buffer elsewhere.

    The constructor blocks until all ``world_size`` members have joined, so
    rank 0 and the workers must open it concurrently (rank 0 hosts the store).

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
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str,
                 device: str | torch.device = "cpu", timeout_s: float = 600.0,
                 op_timeout_s: float = OP_TIMEOUT_S, label: str | None = None) -> None:
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
        self._comm = self._pg = self._store = None
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"nccl needs a CUDA device, got {self.device}")
        if backend == "gloo":
            from torch.distributed import PrefixStore, TCPStore
            from torch.distributed.distributed_c10d import ProcessGroupGloo

            from actors.netif import use_node_interface

            use_node_interface()  # reachable from the other nodes, not the hostname's 127.0.0.1 (actors/netif.py)
            timeout = timedelta(seconds=timeout_s)
            store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
            self._pg = ProcessGroupGloo(PrefixStore(_STORE_PREFIX, store), rank, world_size, timeout)
            self._store = store  # the group only borrows it
        else:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup

            pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                              store_timeout=int(timeout_s))
            self._comm = PyNcclCommunicator(pg, device=self.device)
            self._store = pg.store
        self._announce(label)

    # ------------------------------------------------------------ members
    def _announce(self, label: str | None) -> None:
        import os
        import socket

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
    def begin_round(self) -> None:
        """The next operation starts a round: it may wait up to ``timeout_s``."""
        self._first = True

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
        bound = self.timeout_s if self._first else self.op_timeout_s
        self._first = False
        if self.backend == "gloo":
            from torch.distributed import BroadcastOptions

            opts = BroadcastOptions()
            opts.rootRank = 0
            opts.timeout = timedelta(seconds=bound)
            try:
                self._pg.broadcast([tensor], opts).wait()
            except RuntimeError as exc:
                self._fail(what, bound, str(exc).splitlines()[0])
        else:
            stream = torch.cuda.current_stream(self.device)
            self._comm.broadcast(tensor, src=0, stream=stream)
            self._watch(stream, what, bound)

    def _watch(self, stream, what: str, bound: float) -> None:
        """Wait for the NCCL operation just queued on ``stream``, within ``bound``, watching NCCL's errors."""
        import time

        done = torch.cuda.Event()
        done.record(stream)
        deadline = time.monotonic() + bound
        pause = 1e-4
        while not done.query():
            error = self._nccl_async_error()
            if error:
                self._fail(what, bound, f"NCCL reported {error}")
            if time.monotonic() > deadline:
                self._fail(what, bound, f"not complete within {bound:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _nccl_async_error(self) -> str | None:
        """NCCL's asynchronous error on the communicator (a peer's connection lost), or None;
        None also where the library does not expose it."""
        import ctypes

        try:
            nccl, comm = self._comm.nccl, self._comm.comm
            handle = comm if isinstance(comm, ctypes.c_void_p) else ctypes.c_void_p(comm)
            result = ctypes.c_int(0)
            if nccl.lib.ncclCommGetAsyncError(handle, ctypes.byref(result)) != 0:
                return None
        except (AttributeError, OSError):
            return None
        if result.value in (0, 7):  # ncclSuccess, ncclInProgress
            return None
        return nccl.ncclGetErrorString(result.value)

    def _fail(self, what: str, bound: float, cause: str) -> None:
        """Abort the group (pending operations end; the other members see their peer gone) and raise."""
        self._failed = (f"{self.describe()}: broadcast of {what or 'a tensor'} failed "
                        f"(bound {bound:.0f} s): {cause}. A member is gone or stalled")
        self._abort()
        raise WeightGroupError(self._failed)

    def _abort(self) -> None:
        comm, pg = self._comm, self._pg
        self._comm = self._pg = None
        if comm is not None:
            comm.destroy()  # ncclCommAbort in a bounded thread (vLLM's PyNcclCommunicator)
        if pg is not None:
            pg.abort()

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


def weight_records(tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    """name -> tensor as records that cross vLLM's multiprocess RPC (msgpack): raw bytes with dtype
    and shape (bf16 as its int16 bits, keeping its dtype name). ``load_weight_records`` reads them."""
    records = []
    for name, t in (tensors.items() if isinstance(tensors, Mapping) else tensors):
        t = torch.as_tensor(t).detach().contiguous().cpu()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        records.append({"name": str(name), "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "data": raw.numpy().tobytes()})
    return records


def refresh_tied_cpu_weights(model: torch.nn.Module) -> int:
    """Re-run CPU weight processing of embedding-method layers whose weight is shared; returns how many.

    Only on CPU and only for unquantized embeddings/heads: their processing
    just rebuilds the packed GEMM from the current weight, so running it again
    is safe; quantized methods transform weights in place and must not be rerun.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0  # GPU kernels read the (shared, updated) weight itself
    holders: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            holders.setdefault(id(weight), []).append(module)
    refreshed = 0
    for modules in holders.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if isinstance(method, UnquantizedEmbeddingMethod):
                method.process_weights_after_loading(module)
                refreshed += 1
    return refreshed


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); reached through ``collective_rpc``.

    vLLM refuses an extension whose attribute names clash with the worker's,
    hence the ``_seal_`` prefix on state.
    """

    def refresh_tied_weights(self) -> int:
        return refresh_tied_cpu_weights(self.get_model())

    def begin_weight_records(self) -> None:
        """Open one in-place reload that ``load_weight_records`` calls feed bucket after bucket
        and ``finish_weight_records`` closes: vLLM's layerwise reload processes a layer once all
        of its weights have come, so a layer split over two buckets is still processed whole
        (a reload per bucket would process it half loaded). A round left open by a failed
        update is closed first, so this one starts from a clean state."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if getattr(self, "_seal_records_open", False):
            self.finish_weight_records()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.get_model())
        self._seal_records_open = True

    def load_weight_records(self, records: list[Mapping[str, Any]]) -> int:
        """Load name/dtype/shape/raw-bytes records into the open reload (vLLM's multiprocess RPC
        turns tensors into lists; bytes cross it as they are); returns how many."""
        from vllm.config import set_current_vllm_config

        if not getattr(self, "_seal_records_open", False):
            raise RuntimeError("load_weight_records before begin_weight_records")

        def tensors():
            for r in records:
                dtype = getattr(torch, str(r["dtype"]))
                flat = torch.frombuffer(bytearray(r["data"]), dtype=dtype)  # bytearray: writable, owned
                yield str(r["name"]), flat.reshape(tuple(r["shape"])).to(self.device)

        with set_current_vllm_config(self.vllm_config):
            self.get_model().load_weights(tensors())
        return len(records)

    def finish_weight_records(self) -> None:
        """Close the reload: layers that got no weights keep theirs; a tied CPU lm_head is re-derived."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        self._seal_records_open = False
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self.get_model(), self.vllm_config.model_config)
        for reset in ("reset_encoder_cache", "reset_mm_cache"):  # what the runner's reload_weights does after
            getattr(self.model_runner, reset, lambda: None)()
        refresh_tied_cpu_weights(self.get_model())

    def init_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str,
                          timeout_s: float = 600.0, label: str = "") -> int:
        """``rank`` is the group rank of the engine's first worker; tensor-parallel worker i takes rank + i.
        ``label``: who this engine is (the rank-0 side names it in errors)."""
        worker = int(getattr(self, "rank", 0))
        my_rank = rank + worker
        old, self._seal_weight_group = getattr(self, "_seal_weight_group", None), None
        if old is not None:  # re-formed (a replica restored, a learner restarted): the old communicator goes first
            old.close()
        who = f"{label or 'generator'} worker {worker}"
        self._seal_weight_group = WeightGroup(host, port, my_rank, world_size, backend, self.device, timeout_s, label=who)
        return my_rank

    def weight_group_open(self) -> bool:
        """Whether this worker holds an open weight group (tests: a re-formed group leaves none behind)."""
        group = getattr(self, "_seal_weight_group", None)
        return group is not None and not group.closed

    def receive_weights(self, metadata: list[WeightMeta | Mapping[str, Any]], bucket_bytes: int = 1 << 30) -> int:
        """Receive one round from rank 0 and load it in place; returns the number of tensors.

        Tensors are received into buckets of about ``bucket_bytes`` and each
        bucket is loaded before the next is received: the learner waits out
        every load but its last, and the worker holds one bucket beyond the
        model. 0 = one tensor at a time (least memory; measured on CPU with
        the 135M model: the learner blocked ~1 s against ~0.3 s with the whole
        model in one bucket). After a failed round the model is part loaded:
        send a whole round again before generating.
        """
        group = getattr(self, "_seal_weight_group", None)
        if group is None:
            raise RuntimeError("receive_weights before init_weight_group")
        metas = [WeightMeta.from_wire(m) for m in metadata]
        state = {"received": 0, "comm_failed": False}
        group.begin_round()

        def arriving():
            bucket, size = [], 0
            for i, meta in enumerate(metas):
                buf = torch.empty(meta.shape, dtype=meta.torch_dtype, device=self.device)
                try:
                    group.broadcast(buf, meta.name)
                except Exception:
                    state["comm_failed"] = True
                    raise
                state["received"] += 1
                bucket.append((meta.name, buf))
                size += buf.numel() * buf.element_size()
                if size >= bucket_bytes or i == len(metas) - 1:
                    yield from bucket
                    bucket, size = [], 0

        stream = arriving()
        try:
            self.reload_weights(weights_iterator=stream)
        except Exception:
            # Rank 0 goes on sending whatever the load did with the tensors: take
            # the rest off the wire so the group is in step for the next round.
            if not state["comm_failed"]:
                for _ in stream:
                    pass
            raise
        unread = [name for name, _ in stream]  # a loader that stopped early leaves rank 0 waiting
        group.synchronize()
        refresh_tied_cpu_weights(self.get_model())
        if unread:
            raise RuntimeError(f"the model loader did not take {len(unread)} tensors, e.g. {unread[:3]}")
        return state["received"]


def _register_transfer_engine() -> None:
    """In a vLLM worker (which imports this module as its extension) make ``seal_gloo``
    known before the worker builds its weight-transfer engine; elsewhere do nothing."""
    import sys

    if "vllm" in sys.modules:
        from actors.weight_transfer import register

        register()


_register_transfer_engine()
