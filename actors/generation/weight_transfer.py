"""The weight group as vLLM weight-transfer engines (``seal_gloo`` on CPU, ``seal_nccl`` on CUDA).

vLLM 0.32 moves weights from a trainer into its workers through
``vllm.distributed.weight_transfer``: a worker-side engine per backend, made
by ``WeightTransferEngineFactory`` from ``weight_transfer_config.backend``,
driven by ``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update`` on the engine. Its NCCL backend
needs CUDA, waits a fixed 300 s for the rendezvous and receives with no bound;
so this module registers its own: the trainer-rooted broadcast of ``weights/broadcast_group.py``
(a TCPStore, the learner's rank 0 as root, each worker at ``rank_offset`` + its
worker rank; gloo or NCCL), bounded per operation, with the round's "ready"
handshake, and with the NCCL backend's update info (names, dtype names,
shapes, in sending order), so the learner's broadcaster (learner/weight_broadcast.py)
feeds either backend unchanged (vLLM's NCCL one with ``packed=False``).

Weights load through vLLM's layerwise reload (``start``/``finish_weight_update``),
as the NCCL backend does; on CPU a tied lm_head is re-derived after it
(``refresh_tied_cpu_weights``). Registration happens when this module is
imported: in the replica's process before its engine starts, and in each
worker through the worker extension (actors/generation/weight_worker.py imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch  # noqa: TID253 - this module is itself in banned-module-level-imports: imported lazily

# Named where the engine settings pick a device's backend (importing no torch or vLLM there).
from actors.generation.engine_settings import GLOO_TRANSFER_BACKEND as BACKEND
from actors.generation.engine_settings import NCCL_TRANSFER_BACKEND, SEAL_TRANSFER_BACKENDS

_ENGINES = {BACKEND: "GlooWeightTransferEngine", NCCL_TRANSFER_BACKEND: "NcclWeightTransferEngine"}


def register() -> None:
    """Make ``seal_gloo`` and ``seal_nccl`` known to vLLM's factory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for name, cls in _ENGINES.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, __name__, cls)


def init_info(
    host: str, port: int, rank_offset: int, world_size: int, backend: str, timeout_s: float, label: str = ""
) -> dict:
    """The payload of ``init_weight_transfer_engine`` for ``backend`` (TCPStore rendezvous on host:port).
    ``label``: who the engine is, named by the rank-0 side in errors (ours only: vLLM's NCCL
    init info has no such field, nor a timeout)."""
    if backend in SEAL_TRANSFER_BACKENDS:
        return {
            "host": host,
            "port": int(port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "timeout_s": float(timeout_s),
            "label": str(label),
        }
    return {
        "master_address": host,
        "master_port": int(port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "packed": False,
    }


def update_info(metadata) -> dict:
    """The payload of ``update_weights``: the round's tensors in sending order (NCCL's field names)."""
    from weights.broadcast_group import WeightMeta

    metas = [WeightMeta.from_wire(m) for m in metadata]
    return {
        "names": [m.name for m in metas],
        "dtype_names": [m.dtype for m in metas],
        "shapes": [list(m.shape) for m in metas],
    }


if TYPE_CHECKING:
    from weights.broadcast_group import WeightGroup

try:  # the engine classes need vLLM; the helpers above do not
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
except ImportError:  # pragma: no cover - vLLM is part of every install of this repo
    WeightTransferEngine = WeightTransferInitInfo = WeightTransferUpdateInfo = object  # type: ignore[misc, assignment]


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    host: str
    port: int
    rank_offset: int
    world_size: int
    timeout_s: float  # init_info always writes it, from the weight group's timeout
    label: str = ""


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )
        if not self.names:
            raise ValueError("an update carries at least one tensor")


class GlooWeightTransferEngine(WeightTransferEngine):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False
    group_backend = "gloo"  # WeightGroup's

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: WeightGroup | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        from weights.broadcast_group import WeightGroup

        p = self.parallel_config
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        if self.group is not None and not self.group.closed:
            # As vLLM's NCCL engine, which would leak the old communicator here: a re-formed group
            # needs shutdown_weight_transfer_engine first. Refusing (not closing quietly) makes a
            # CPU run catch a caller that would leak on GPU.
            raise RuntimeError(
                f"seal_{self.group_backend} weight transfer: init_transfer_engine while the previous group is open; "
                "call shutdown_weight_transfer_engine first (vLLM's NCCL engine would leak it)"
            )
        self.group = WeightGroup(
            init_info.host,
            init_info.port,
            rank,
            init_info.world_size,
            self.group_backend,
            self.device,
            init_info.timeout_s,
            label=f"{init_info.label or 'generator'} worker {p.rank}",
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(
                f"seal_{self.group_backend} weight transfer: update_weights before init_weight_transfer_engine"
            )
        try:
            self.group.begin_round()
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
                self.group.broadcast(weight, name)
                self.model.load_weights([(name, weight)])  # type: ignore[operator]  # vLLM's model; the base types nn.Module
        except BaseException:
            # vLLM calls finish_weight_update only after a receive that returned: a round that failed
            # would leave the layerwise reload open, and the next round's start_weight_update would
            # find its layers' loaders unwrapped ("'Parameter' object has no attribute 'weight_loader'").
            # Close it without finishing the modules the round began (abort_layerwise_reload): each
            # module holds the old version or the new one, never part of each.
            try:
                abort_layerwise_reload(self.model, self.model_config)
                refresh_tied_cpu_weights(self.model)
            except Exception:  # the receive's own error is the one to report
                pass
            raise

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_tied_cpu_weights(self.model)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class NcclWeightTransferEngine(GlooWeightTransferEngine):
    """``seal_nccl``: the same engine over NCCL (WeightGroup's PyNccl communicator on the worker's
    GPU, its store wait bounded by the group's timeout, every receive by its watchdog)."""

    group_backend = "nccl"


def abort_layerwise_reload(model: torch.nn.Module, model_config) -> list[str]:
    """Close a layerwise reload that a failed round left open (vLLM 0.32's reload/layerwise.py),
    leaving each module whole: the old version's weights or the new one's. Returns the modules
    the round had begun but not finished.

    vLLM processes a module once all of its weights have come (then it holds the new version);
    until then it buffers them. ``finalize_layerwise_reload`` would process a begun module anyway
    (its "delayed processing" of padded weights): materialised by ``torch.empty_strided``, the
    buffered shards loaded, the rest (k and v of a qkv_proj whose q came) whatever the allocator
    held, all copied into the live kernel tensors. Its buffered loads are dropped first, so the
    finalize puts its old tensors back, as for a module the round never reached."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO, finalize_layerwise_reload

    begun = []
    for name, module in model.named_modules():
        info = LAYERWISE_INFO.get(module)
        if info is not None and info.can_load() and info.load_numel > 0:
            begun.append(name)
            info.loaded_weights.clear()
            info.load_numel = 0
    finalize_layerwise_reload(model, model_config)
    return begun


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
