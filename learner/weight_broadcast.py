"""The learner's end of the weight group (rank 0): broadcast weights to the vLLM workers.

See weights/broadcast_group.py for the group, actors/generation/weight_worker.py for the worker side. The group is
not the DeepSpeed training group: only the learner's rank 0 is in it, with
the vLLM workers as ranks 1..N. Metadata (name, dtype, shape per tensor)
goes to the workers by whatever carries control messages; it is fixed for a
model, so ``weight_metadata`` needs no gather even under ZeRO-3.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch  # noqa: TID253 - this module is itself in banned-module-level-imports: imported lazily

from weights.broadcast_group import OP_TIMEOUT_S, WeightGroup, WeightGroupError, WeightMeta  # noqa: TID253 - a torch module too
from weights.buckets import bucket_bounds


def _loaded_in_another_layout(model: Any) -> bool:  # a transformers PreTrainedModel
    """Whether transformers holds ``model``'s parameters in a layout other than its checkpoint's
    (``_weight_conversions``: what ``from_pretrained`` applied; a model built otherwise: its type's
    default conversions). For most models none: their names are the checkpoint's."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        from transformers.conversion_mapping import get_model_conversion_mapping

        conversions = get_model_conversion_mapping(model, add_legacy=False)
    return bool(conversions)


def checkpoint_tensors(model: Any, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """One learner parameter as the model's checkpoint holds it: the (name, tensor) pairs vLLM's
    loader and a snapshot expect. transformers 5 loads some checkpoints into another layout, e.g. a
    MoE layer's per-expert ``experts.<i>.{gate,up,down}_proj.weight`` stacked into one
    ``experts.gate_up_proj`` / ``experts.down_proj`` parameter (DeepSeek V3; Qwen3-MoE, Mixtral):
    sent under the learner's name, vLLM finds no such weight. Here that is undone as
    ``save_pretrained`` undoes it, one parameter at a time (each of these conversions comes from a
    single parameter, so a bucket or a ZeRO-3 gather never needs another); the pieces are views of
    ``tensor``. A meta ``tensor`` gives the names and shapes alone (metadata, snapshot headers)."""
    if not _loaded_in_another_layout(model):
        return [(name, tensor)]
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(model, {name: tensor}).items())


def weight_buckets(
    params: list[tuple[str, torch.nn.Parameter]], bucket_bytes: int, element_size: int = 0
) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Consecutive parameters in buckets of at most ``bucket_bytes`` (full sizes: ZeRO-3's ds_numel);
    a parameter larger than a bucket is a bucket of its own. ``element_size``: count at least this
    many bytes per element (the copy sent in a wider dtype than the one trained)."""
    sizes = [getattr(p, "ds_numel", p.numel()) * max(p.element_size(), element_size) for _, p in params]
    return [params[r.start : r.stop] for r in bucket_bounds(sizes, bucket_bytes)]


def model_weight_buckets(
    model: torch.nn.Module, zero3: bool = False, bucket_bytes: int = 256 << 20, element_size: int = 0
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Bucket by bucket, (name, full tensor) per parameter, in a fixed order, a tied parameter once.

    Under ZeRO-3 one bucket of parameters is gathered at a time and released
    before the next (the caller uses a bucket's tensors before asking for the
    next one): no rank ever holds the full model on top of its shard. The
    gather is a collective of the training group, so every learner rank must
    walk this iterator in step.
    """
    buckets = weight_buckets(list(model.named_parameters()), bucket_bytes, element_size)

    def as_saved(bucket) -> list[tuple[str, torch.Tensor]]:  # the checkpoint's names and layout
        return [pair for name, param in bucket for pair in checkpoint_tensors(model, name, param.data)]

    if not zero3:
        for bucket in buckets:
            yield as_saved(bucket)
        return
    import deepspeed

    for bucket in buckets:
        with deepspeed.zero.GatheredParameters([p for _, p in bucket], modifier_rank=None):
            yield as_saved(bucket)


def model_weights(
    model: torch.nn.Module, zero3: bool = False, bucket_bytes: int = 256 << 20
) -> Iterator[tuple[str, torch.Tensor]]:
    """``model_weight_buckets`` one tensor at a time (the broadcast sends them in this order)."""
    for bucket in model_weight_buckets(model, zero3, bucket_bytes):
        yield from bucket


def checkpoint_specs(model: torch.nn.Module) -> list[tuple[str, torch.Size, torch.dtype]]:
    """(name, full shape, dtype) of each tensor ``model_weights`` yields, in its order, without a gather
    (ZeRO-3 shapes come from ds_shape; ``checkpoint_tensors`` on meta tensors)."""
    out = []
    for name, p in model.named_parameters():
        meta = torch.empty(getattr(p, "ds_shape", p.shape), dtype=p.dtype, device="meta")
        out += [(n, t.shape, t.dtype) for n, t in checkpoint_tensors(model, name, meta)]
    return out


def model_metadata(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[WeightMeta]:
    """What ``model_weights`` will send, cast to ``dtype`` if given."""
    return [WeightMeta.of(name, shape, dtype or d) for name, shape, d in checkpoint_specs(model)]


class WeightBroadcaster:
    """Rank 0 of the weight group; the constructor returns once every worker has joined.

    ``dtype`` casts before sending (e.g. fp32 learner weights to a bf16 vLLM:
    half the bytes on the wire); the metadata given to workers must say the same.
    A round starts once every receiver says it is ready (a replica draining its requests
    first), waited for at most half of ``timeout_s``; each tensor then waits up to
    ``op_timeout_s``; a receiver silent, gone or
    stalled fails the round with ``WeightGroupError`` naming the members, and the
    group is aborted (weights/broadcast_group.py): the caller re-forms it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int,
        backend: str,  # gloo | nccl: the generators' transfer backend (learner/rank.py)
        *,
        timeout_s: float,  # the group's joins: learner.timeout_s (learner/rank.py)
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        op_timeout_s: float = OP_TIMEOUT_S,
    ) -> None:
        device = device if device is not None else ("cuda" if backend == "nccl" else "cpu")
        self.group = WeightGroup(host, port, 0, world_size, backend, device, timeout_s, op_timeout_s)
        self.device = self.group.device
        self.dtype = dtype

    def broadcast(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> float:
        """Send every tensor, in order; returns seconds until the last one is on the wire and done."""
        items = iter(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        t0 = time.perf_counter()
        with torch.no_grad():
            try:
                # Before the first ZeRO-3 gather (``items`` is lazy): a silent receiver fails the round
                # within the ready bound, below the training group's timeout the other ranks wait under.
                self.group.begin_round()
                for name, tensor in items:
                    out = tensor.detach().to(device=self.device, dtype=self.dtype or tensor.dtype).contiguous()
                    self.group.broadcast(
                        out, name
                    )  # the root's buffer is only read: no copy needed when already in place
            except WeightGroupError:
                # Under ZeRO-3 the other learner ranks are in this walk's bucket gathers: finish
                # the walk (nothing sent) so they are not left in a collective rank 0 never joins.
                for _ in items:
                    pass
                raise
        self.group.synchronize()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.group.close()


def broadcast_model(
    model: torch.nn.Module, broadcaster: WeightBroadcaster | None, zero3: bool = False, bucket_bytes: int = 256 << 20
) -> float:
    """Send ``model``'s weights; a learner rank other than 0 passes None and only joins the ZeRO-3 gathers."""
    if broadcaster is None:
        t0 = time.perf_counter()
        for _ in model_weights(model, zero3, bucket_bytes):
            pass
        return time.perf_counter() - t0
    return broadcaster.broadcast(model_weights(model, zero3, bucket_bytes))
