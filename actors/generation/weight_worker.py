"""The engine side of the weight group: vLLM's worker extension (``worker_extension_cls``).

The learner's rank 0 broadcasts (learner/weight_broadcast.py) over the group in weights/broadcast_group.py;
each vLLM worker joins it here and feeds what arrives to vLLM's in-place reload, bucket by bucket.
Weights that come instead as records (Ray's object store, a file) go through the same reload via
``begin_weight_records`` / ``load_weight_records`` / ``finish_weight_records``; ``weight_records``
makes those records on the engine's side of vLLM's RPC. A tied CPU lm_head is re-derived after
every reload (``refresh_tied_cpu_weights``, see actors/generation/weight_transfer.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch  # noqa: TID253 - this module is itself in banned-module-level-imports: imported lazily

from actors.generation.adapters import write_adapter_files
from actors.generation.weight_transfer import abort_layerwise_reload, refresh_tied_cpu_weights, register  # noqa: TID253 - a torch module too
from weights.broadcast_group import WeightGroup, WeightMeta  # noqa: TID253 - a torch module too


def weight_records(tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    """name -> tensor as records that cross vLLM's multiprocess RPC (msgpack): raw bytes with dtype
    and shape (bf16 as its int16 bits, keeping its dtype name). ``load_weight_records`` reads them."""
    records = []
    for name, t in tensors.items() if isinstance(tensors, Mapping) else tensors:
        t = torch.as_tensor(t).detach().contiguous().cpu()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        records.append(
            {
                "name": str(name),
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "data": raw.numpy().tobytes(),
            }
        )
    return records


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); reached through ``collective_rpc``.

    vLLM refuses an extension whose attribute names clash with the worker's,
    hence the ``_seal_`` prefix on state.
    """

    # What the mixin reads of vLLM's worker (declared for the type checker; the worker defines them).
    device: torch.device
    vllm_config: Any
    model_runner: Any

    if TYPE_CHECKING:

        def get_model(self) -> Any: ...  # the vLLM model (load_weights, ...)

        def reload_weights(self, *args: Any, **kwargs: Any) -> Any: ...

    def refresh_tied_weights(self) -> int:
        return refresh_tied_cpu_weights(self.get_model())

    def begin_weight_records(self) -> None:
        """Open one in-place reload that ``load_weight_records`` calls feed bucket after bucket
        and ``finish_weight_records`` closes: vLLM's layerwise reload processes a layer once all
        of its weights have come, so a layer split over two buckets is still processed whole
        (a reload per bucket would process it half loaded). A round left open by a failed
        update is aborted first (``abort_weight_records``), so this one starts from a clean state."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if getattr(self, "_seal_records_open", False):
            self.abort_weight_records()
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

    def abort_weight_records(self) -> list[str]:
        """Close a reload whose load failed or was cancelled (actors/generation/sources.py): each module
        keeps its old weights unless the round had processed it whole (abort_layerwise_reload). Left
        open, the modules not yet loaded would stay on the meta device and the next forward kill the
        engine. Returns the modules begun and not finished; nothing open: nothing done."""
        if not getattr(self, "_seal_records_open", False):
            return []
        self._seal_records_open = False
        return self._seal_abort_reload()

    def _seal_abort_reload(self) -> list[str]:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            begun = abort_layerwise_reload(self.get_model(), self.vllm_config.model_config)
        for reset in ("reset_encoder_cache", "reset_mm_cache"):
            getattr(self.model_runner, reset, lambda: None)()
        refresh_tied_cpu_weights(self.get_model())
        return begun

    def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, label: str = ""
    ) -> int:
        """``rank`` is the group rank of the engine's first worker; tensor-parallel worker i takes rank + i.
        ``label``: who this engine is (the rank-0 side names it in errors)."""
        worker = int(getattr(self, "rank", 0))
        my_rank = rank + worker
        old, self._seal_weight_group = getattr(self, "_seal_weight_group", None), None
        if old is not None:  # re-formed (a replica restored, a learner restarted): the old communicator goes first
            old.close()
        who = f"{label or 'generator'} worker {worker}"
        self._seal_weight_group = WeightGroup(
            host, port, my_rank, world_size, backend, self.device, timeout_s, label=who
        )
        return my_rank

    def receive_weights(self, metadata: list[WeightMeta | Mapping[str, Any]], bucket_bytes: int = 1 << 30) -> int:
        """Receive one round from rank 0 and load it in place; returns the number of tensors.

        Tensors are received into buckets of about ``bucket_bytes`` and each
        bucket is loaded before the next is received: the learner waits out
        every load but its last, and the worker holds one bucket beyond the
        model. 0 = one tensor at a time (least memory; measured on CPU with
        the 135M model: the learner blocked ~1 s against ~0.3 s with the whole
        model in one bucket). After a failed round each module holds the old
        version, or the new one where the round finished it: send a whole
        round again before generating.
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
            # vLLM's reload_weights has no finally: its layerwise reload is still open, the modules
            # not reached on the meta device, the begun one buffered. Closed here, each module whole.
            try:
                self._seal_abort_reload()
            except Exception:  # the round's own error is the one to report
                pass
            raise
        unread = [name for name, _ in stream]  # a loader that stopped early leaves rank 0 waiting
        group.synchronize()
        refresh_tied_cpu_weights(self.get_model())
        if unread:
            raise RuntimeError(f"the model loader did not take {len(unread)} tensors, e.g. {unread[:3]}")
        return state["received"]

    def receive_adapter(self, metadata: list[WeightMeta | Mapping[str, Any]], directory: str) -> int:
        """Receive one round of LoRA adapter tensors (a publish under ``learner.cfg.lora``: megabytes,
        held whole) over whichever weight group this worker joined, and write them as peft's adapter
        directory (the first worker; the others only take their part in the round) for the replica to
        load by path (actors/generation/adapters.py). The model's own weights are not touched, so a
        round that fails leaves nothing to undo. Returns the number of tensors."""
        group = getattr(self, "_seal_weight_group", None)  # the blocking engine's (init_weight_group)
        transfer = getattr(self, "weight_transfer_engine", None)  # the async engine's (seal_gloo / seal_nccl)
        group = group if group is not None else getattr(transfer, "group", None)
        if group is None:
            raise RuntimeError("receive_adapter before the worker joined a weight group")
        metas = [WeightMeta.from_wire(m) for m in metadata]
        group.begin_round()
        tensors = {}
        for meta in metas:
            buf = torch.empty(meta.shape, dtype=meta.torch_dtype, device=self.device)
            group.broadcast(buf, meta.name)
            tensors[meta.name] = buf
        group.synchronize()
        if int(getattr(self, "rank", 0)) == 0:
            write_adapter_files(directory, tensors)
        return len(tensors)


def _register_transfer_engine() -> None:
    """In a vLLM worker (which imports this module as its extension) make ``seal_gloo``
    known before the worker builds its weight-transfer engine; elsewhere do nothing."""
    if "vllm" in sys.modules:
        register()


_register_transfer_engine()
