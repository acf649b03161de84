"""Weights out of a learner: full or bucket-by-bucket gathers (ZeRO-3), the generator's copy in its
dtype (bucket by bucket into Ray's object store, or whole for an in-process generator), safetensors
snapshots and the broadcast group. learner.engine.Learner holds one as ``weights_out``, built on
the policy model it trains."""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from learner.lora import (
    adapter_manifest,
    adapter_metadata,
    broadcast_adapter,
    gathered,
    lora_on,
    merged_model,
    merged_skeleton,
    publishes_adapter,
)
from learner.safetensors_out import DTYPES, ShardedWriter, TensorSpec
from weights.buckets import put_buckets

if TYPE_CHECKING:
    from learner.config import LearnerConfig

# Largest safetensors file of a snapshot; more weights go to model-0000i-of-0000n shards and an
# index, the layout save_pretrained writes (its default shard size: transformers 5).
SNAPSHOT_SHARD_BYTES = 50 * 10**9


@dataclass(frozen=True)
class WeightsOutStats:
    """What one rank's last weights-out call (``save_snapshot``, ``weight_manifest``) took, in bytes:
    ``host_bytes`` of full weights it brought to host memory (a device-to-host copy on GPU; on a
    CPU learner the tensor read in place), ``largest_gather_bytes`` the most full-size weights it
    held gathered at once under ZeRO-3 (one bucket; 0 otherwise)."""

    host_bytes: int = 0
    largest_gather_bytes: int = 0


class _Tally:
    def __init__(self, zero3: bool) -> None:
        self.zero3, self.host, self.largest = zero3, 0, 0

    def gathered(self, bucket) -> None:
        if self.zero3:
            self.largest = max(self.largest, sum(t.numel() * t.element_size() for _, t in bucket))

    def to_host(self, tensor, dtype=None, copy: bool = False):
        out = tensor.detach().to("cpu", dtype or tensor.dtype, copy=copy)
        self.host += out.numel() * out.element_size()
        return out

    def result(self) -> WeightsOutStats:
        return WeightsOutStats(self.host, self.largest)


class WeightsOut:
    """The weights of one learner rank's policy ``model`` (its ``cfg``, loaded from ``model_path``) on
    their way out; ``zero3``: partitioned, so every rank gathers with the others. It holds no
    reference back to the learner: a learner is freed (and with it a ZeRO-3 config that would
    partition later models: learner/engine.py) as soon as its last reference goes."""

    snapshot_shard_bytes: int = SNAPSHOT_SHARD_BYTES  # a test makes it small to see shards and the index

    def __init__(self, model: Any, cfg: LearnerConfig, model_path: str, rank: int, zero3: bool) -> None:
        self.model, self.cfg, self.model_path = model, cfg, model_path
        self.rank, self.zero3 = rank, zero3
        self.last_stats = WeightsOutStats()  # what this rank's last weights-out call took

    @property
    def out_zero3(self) -> bool:
        """Whether the model ``_out_model`` yields is partitioned (ZeRO-3 without LoRA; under LoRA it
        is a merged model, plain and whole)."""
        return self.zero3 and not lora_on(self.cfg)

    def _full_cpu(self, named_tensors, zero3: bool) -> dict[str, Any]:
        """name -> full (gathered) fp32 tensor on CPU, whatever the ZeRO stage;
        ``named_tensors`` is called inside the gather."""
        if zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in named_tensors()}
        return {k: v.detach().cpu().clone() for k, v in named_tensors()}

    @contextlib.contextmanager
    def _out_model(self, on_host: bool = False):
        """The model weights leave from: the policy, or under LoRA the base with the adapter merged,
        under the base's names, built for this call and dropped after (learner/lora.py); ``on_host``:
        the call copies every weight to the host anyway, so the merged model is built there. Under ZeRO-3
        every rank joins the whole model's gather (one collective) and rank 0 alone builds the merged
        model, a plain one: the other ranks get a model without parameters, nothing left to walk."""
        if not lora_on(self.cfg):
            yield self.model
            return
        import torch

        with gathered(self.model, self.zero3, adapter_only=False):
            merged = (
                merged_model(self.model, self.model_path, on_host)
                if self.rank == 0 or not self.zero3
                else torch.nn.Module()
            )
        yield merged

    @property
    def bucket_bytes(self) -> int:
        return int(self.cfg.weight_bucket_mb * 2**20)

    def weight_manifest(self, dtype: str | None = None):
        """The generator's weights into Ray's object store, bucket by bucket (``weight_bucket_mb``):
        every rank walks the bucketed gathers in step (a ZeRO-3 collective); rank 0 casts each
        bucket to the generator's ``dtype`` (None: fp32 as trained), puts it into the store as
        its own object and drops its host copy before the next gather. Rank 0 returns the
        ``WeightManifest`` (weights/buckets.py), the other ranks None."""
        if publishes_adapter(self.cfg):  # the adapter alone (learner/lora.py), gathered under ZeRO-3
            with gathered(self.model, self.zero3):
                return adapter_manifest(self.model, dtype, self.cfg.weight_bucket_mb) if self.rank == 0 else None
        import torch

        from learner.weight_broadcast import model_weight_buckets

        target = getattr(torch, dtype) if dtype else None
        # Cut buckets to the larger of the trained and the sent element: neither the gathered
        # bucket on the device nor the object in the store exceeds the bucket size.
        element_size = torch.empty((), dtype=target).element_size() if target is not None else 0
        with self._out_model(on_host=True) as model:
            buckets = model_weight_buckets(model, self.out_zero3, self.bucket_bytes, element_size)
            stats = _Tally(self.out_zero3)
            if self.rank != 0:
                for bucket in buckets:
                    stats.gathered(bucket)
                self.last_stats = stats.result()
                return None

            def host(bucket):
                stats.gathered(bucket)
                # A copy even on a CPU learner: the gathered tensor is freed when the next gather starts.
                return [(name, stats.to_host(t, target, copy=True)) for name, t in bucket]

            sent = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
            manifest = put_buckets((host(b) for b in buckets), sent, self.cfg.weight_bucket_mb)
        self.last_stats = stats.result()
        return manifest

    def full_state_dict(self) -> dict[str, Any]:
        """Full (gathered) fp32 weights on CPU, whatever the ZeRO stage."""
        return self._full_cpu(lambda: self.model.state_dict().items(), self.zero3)

    def generator_weights(self, dtype: str | None = None) -> dict[str, Any]:
        """What a weight update carries to the generator: full parameters on
        CPU, a tied parameter once, cast to the generator's ``dtype`` (bfloat16 |
        float32; None: the fp32 master weights as they are). The state dict also
        holds a tied lm_head under its own name, which vLLM skips on load: 17% of
        the embedded model's bytes moved for nothing."""
        import torch

        from learner.weight_broadcast import checkpoint_tensors

        with self._out_model(on_host=True) as model:
            weights = self._full_cpu(  # under the checkpoint's names, as vLLM loads them (checkpoint_tensors)
                lambda: (
                    pair for name, p in model.named_parameters() for pair in checkpoint_tensors(model, name, p.data)
                ),
                self.out_zero3,
            )
        if dtype is None:
            return weights
        target = getattr(torch, dtype)
        return {k: v.to(target) for k, v in weights.items()}

    def save_snapshot(self, out_dir: str | Path, version: int, step: int) -> tuple[Path, float]:
        """A versioned safetensors snapshot generators and transformers load, laid out as
        ``save_pretrained`` lays it out, recording ``version`` and the learner's optimizer ``step``
        (seal-version.json); (path, seconds). Every rank calls it (a ZeRO-3 collective):
        the weights are gathered a bucket at a time (``weight_bucket_mb``) and only rank 0 copies
        them to the host and writes them, tensor by tensor (learner/safetensors_out.py). No rank
        holds the whole model beyond its shard, on the device or the host; ``last_stats`` says
        what this rank took."""
        t0 = time.perf_counter()
        with self._out_model(on_host=True) as model:
            return self._write_snapshot(model, Path(out_dir) / f"v{version:06d}", version, step, t0)

    def _write_snapshot(self, model, out: Path, version: int, step: int, t0: float) -> tuple[Path, float]:
        from learner.weight_broadcast import model_weight_buckets

        tmp = out.with_name(out.name + ".tmp")
        buckets = model_weight_buckets(model, self.out_zero3, self.bucket_bytes)
        stats = _Tally(self.out_zero3)
        if self.rank != 0:
            for bucket in buckets:
                stats.gathered(bucket)
            self.last_stats = stats.result()
            return out, time.perf_counter() - t0
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        params, buffers = self._snapshot_contents(model)
        writer = ShardedWriter(
            tmp,
            params + [spec for spec, _ in buffers],
            self.snapshot_shard_bytes,
            total_parameters=sum(s.nbytes // DTYPES[s.dtype][1] for s in params),
        )
        failure: BaseException | None = None
        for bucket in buckets:  # every bucket, even after a failure: the other ranks wait in its gather
            stats.gathered(bucket)
            if failure is None:
                try:
                    for name, tensor in bucket:
                        writer.write(name, stats.to_host(tensor))
                except Exception as exc:  # re-raised once the gathers are done
                    failure = exc
        if failure is not None:
            self.last_stats = stats.result()
            writer.abort()
            shutil.rmtree(tmp, ignore_errors=True)
            raise failure
        for spec, tensor in buffers:  # persistent buffers: whole on every rank, no gather
            writer.write(spec.name, stats.to_host(tensor))
        writer.close()
        self._save_configs(model, tmp)
        (tmp / "seal-version.json").write_text(json.dumps({"version": version, "step": step}))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        self.last_stats = stats.result()
        return out, time.perf_counter() - t0

    def _snapshot_contents(self, model):
        """(the parameters' TensorSpecs in ``model_weight_buckets`` order, a tied one once; the
        persistent buffers as (TensorSpec, tensor)): what ``save_pretrained`` puts in the file."""
        from learner.weight_broadcast import checkpoint_specs

        named = list(model.named_parameters())
        # The checkpoint's names and layout, as model_weight_buckets writes them (checkpoint_tensors).
        params = [TensorSpec.of(n, shape, dtype) for n, shape, dtype in checkpoint_specs(model)]
        held = {id(p) for _, p in named}
        buffers = [
            (TensorSpec.of(n, t.shape, t.dtype), t)
            for n, t in model.state_dict(keep_vars=True).items()
            if id(t) not in held
        ]
        return params, buffers

    def _save_configs(self, model, directory: Path) -> None:
        """config.json and generation_config.json as ``save_pretrained`` writes them beside the weights."""
        config = copy.deepcopy(model.config)  # save_pretrained sets these two on the model's own
        config.dtype = str(model.dtype).removeprefix("torch.")
        config.architectures = [type(model).__name__]
        config.save_pretrained(directory)
        if model.can_generate() and getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(directory)

    def broadcast_weights(self, broadcaster) -> float:
        """Weights to vLLM over the weight group (learner/weight_broadcast.py), gathered per parameter
        under ZeRO-3 (ranks other than 0 pass None); seconds. ``weight_metadata`` says what is sent."""
        if publishes_adapter(self.cfg):
            return broadcast_adapter(self.model, broadcaster, self.zero3)
        from learner.weight_broadcast import broadcast_model

        with self._out_model() as model:
            return broadcast_model(
                model,
                broadcaster,
                zero3=self.out_zero3,
                bucket_bytes=self.bucket_bytes,
            )

    def weight_metadata(self, dtype=None) -> list:
        if publishes_adapter(self.cfg):
            return adapter_metadata(self.model, dtype)
        from learner.weight_broadcast import model_metadata

        if lora_on(self.cfg):  # the merged model's names and shapes: the base's, read without weights
            return model_metadata(merged_skeleton(self.model_path), dtype)
        return model_metadata(self.model, dtype)
