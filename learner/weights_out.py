"""Weights out of a learner: full or bucket-by-bucket gathers (ZeRO-3), the generator's copy in its
dtype (bucket by bucket into Ray's object store, or whole for an in-process generator), safetensors
snapshots and the broadcast group. A mixin of learner.engine.Learner, which
holds the model, engine, rank and config these read."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any


class WeightsOut:
    def _full_cpu(self, named_tensors) -> dict[str, Any]:
        """name -> full (gathered) fp32 tensor on CPU, whatever the ZeRO stage;
        ``named_tensors`` is called inside the gather."""
        if self.engine is not None and self.cfg.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in named_tensors()}
        return {k: v.detach().cpu().clone() for k, v in named_tensors()}

    @property
    def bucket_bytes(self) -> int:
        return int(self.cfg.weight_bucket_mb * 2**20)

    def weight_manifest(self, dtype: str | None = None):
        """The generator's weights into Ray's object store, bucket by bucket (``weight_bucket_mb``):
        every rank walks the bucketed gathers in step (a ZeRO-3 collective); rank 0 casts each
        bucket to the generator's ``dtype`` (None: fp32 as trained), puts it into the store as
        its own object and drops its host copy before the next gather. Rank 0 returns the
        ``WeightManifest`` (actors/weight_buckets.py), the other ranks None."""
        import torch

        from actors.weight_buckets import put_buckets
        from learner.weight_broadcast import model_weight_buckets

        zero3 = self.engine is not None and self.cfg.zero_stage == 3
        target = getattr(torch, dtype) if dtype else None
        # Cut buckets to the larger of the trained and the sent element: neither the gathered
        # bucket on the device nor the object in the store exceeds the bucket size.
        element_size = torch.empty((), dtype=target).element_size() if target is not None else 0
        buckets = model_weight_buckets(self.model, zero3, self.bucket_bytes, element_size)
        if self.rank != 0:
            for _ in buckets:
                pass
            return None

        def host(bucket):
            return [(name, t.detach().cpu().to(target or t.dtype, copy=True)) for name, t in bucket]

        sent = dtype or str(next(self.model.parameters()).dtype).removeprefix("torch.")
        return put_buckets((host(b) for b in buckets), sent, self.cfg.weight_bucket_mb)

    def full_state_dict(self) -> dict[str, Any]:
        """Full (gathered) fp32 weights on CPU, whatever the ZeRO stage."""
        return self._full_cpu(lambda: self.model.state_dict().items())

    def generator_weights(self, dtype: str | None = None) -> dict[str, Any]:
        """What a weight update carries to the generator: full parameters on
        CPU, a tied parameter once, cast to the generator's ``dtype`` (bfloat16 |
        float32; None: the fp32 master weights as they are). The state dict also
        holds a tied lm_head under its own name, which vLLM skips on load: 17% of
        the embedded model's bytes moved for nothing."""
        import torch

        weights = self._full_cpu(self.model.named_parameters)
        if dtype is None:
            return weights
        target = getattr(torch, dtype)
        return {k: v.to(target) for k, v in weights.items()}

    def publish(self, out_dir: str | Path, version: int) -> tuple[Path, float]:
        """A versioned safetensors snapshot generators can load; (path, seconds)."""
        t0 = time.perf_counter()
        out = Path(out_dir) / f"v{version:06d}"
        tmp = out.with_name(out.name + ".tmp")
        state = self.full_state_dict()  # a collective under ZeRO-3: every rank calls publish
        if self.rank != 0:
            return out, time.perf_counter() - t0
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        (tmp / "seal-version.json").write_text(json.dumps({"version": version, "step": self.step}))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        return out, time.perf_counter() - t0

    def broadcast_weights(self, broadcaster) -> float:
        """Weights to vLLM over the weight group (learner/weight_broadcast.py), gathered per parameter
        under ZeRO-3 (ranks other than 0 pass None); seconds. ``weight_metadata`` says what is sent."""
        from learner.weight_broadcast import broadcast_model

        return broadcast_model(self.model, broadcaster, zero3=self.engine is not None and self.cfg.zero_stage == 3,
                               bucket_bytes=self.bucket_bytes)

    def weight_metadata(self, dtype=None) -> list:
        from learner.weight_broadcast import model_metadata

        return model_metadata(self.model, dtype)
