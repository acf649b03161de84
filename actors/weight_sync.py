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
order. A worker receives each into a fresh buffer on its device and feeds
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


class WeightGroup:
    """One member of the weight group; ``broadcast`` sends from rank 0 and fills the buffer elsewhere.

    The constructor blocks until all ``world_size`` members have joined, so
    rank 0 and the workers must open it concurrently (rank 0 hosts the store).
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str,
                 device: str | torch.device = "cpu", timeout_s: float = 600.0) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 2 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = _resolve_device(device)
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"nccl needs a CUDA device, got {self.device}")
        if backend == "gloo":
            from torch.distributed import BroadcastOptions, PrefixStore, TCPStore
            from torch.distributed.distributed_c10d import ProcessGroupGloo

            from actors.netif import use_node_interface

            use_node_interface()  # reachable from the other nodes, not the hostname's 127.0.0.1 (actors/netif.py)
            timeout = timedelta(seconds=timeout_s)
            store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
            self._pg = ProcessGroupGloo(PrefixStore(_STORE_PREFIX, store), rank, world_size, timeout)
            self._store = store  # the group only borrows it
            self._opts = BroadcastOptions()
            self._opts.rootRank = 0
        else:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup

            pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                              store_timeout=int(timeout_s))
            self._comm = PyNcclCommunicator(pg, device=self.device)

    def broadcast(self, tensor: torch.Tensor) -> None:
        if tensor.device != self.device:
            raise ValueError(f"tensor is on {tensor.device}, the group works on {self.device}")
        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor")
        if self.backend == "gloo":
            self._pg.broadcast([tensor], self._opts).wait()
        else:
            self._comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream(self.device))

    def synchronize(self) -> None:
        """NCCL calls only enqueue work; wait for it (timing, or handing buffers to another stream)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.backend == "nccl" and getattr(self, "_comm", None) is not None:
            self._comm.destroy()
        self._comm = self._pg = self._store = None


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
                          timeout_s: float = 600.0) -> int:
        """``rank`` is the group rank of the engine's first worker; tensor-parallel worker i takes rank + i."""
        my_rank = rank + int(getattr(self, "rank", 0))
        old = getattr(self, "_seal_weight_group", None)
        if old is not None:  # a new learner (e.g. restarted): the old group's peer is gone
            old.close()
        self._seal_weight_group = WeightGroup(host, port, my_rank, world_size, backend, self.device, timeout_s)
        return my_rank

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

        def arriving():
            bucket, size = [], 0
            for i, meta in enumerate(metas):
                buf = torch.empty(meta.shape, dtype=meta.torch_dtype, device=self.device)
                try:
                    group.broadcast(buf)
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
