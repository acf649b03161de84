"""The faults a soak injects inside a generator replica, through the config's own ``_target_``
(``generator._target_=benchmarks.chaos.engine_faults.ChaosAsyncGenerator``, ``+generator.chaos_dir=DIR``):
no hook in production code.

The soak asks for a fault by writing a trigger file into ``chaos_dir``; the first replica to claim it
(an atomic rename, so two replicas never both take one) injects it:

- ``engine_error-*``: the next ``ENGINE_ERROR_CALLS`` generate calls raise, as a failing engine does
  (their episodes end as infra faults; a group left short is re-issued);
- ``weight_round-*``: the next weight update loads its first bucket, then fails part way (the
  replica holds its requests and the fleet restores it, as after a real failed round).

A claimed trigger is renamed ``*.taken-<pid>``: the soak counts what was injected from those.
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.generation.async_vllm_engine import AsyncVllmGenerator
from weights.buckets import WeightManifest, fetch_bucket_async

ENGINE_ERROR_CALLS = 2


def claim(chaos_dir: str | None, kind: str) -> bool:
    """Take one pending trigger of ``kind`` (True), or find none."""
    if not chaos_dir:
        return False
    try:
        names = sorted(n for n in os.listdir(chaos_dir) if n.startswith(kind + "-") and ".taken" not in n)
    except FileNotFoundError:
        return False
    for name in names:
        try:
            os.rename(Path(chaos_dir) / name, Path(chaos_dir) / f"{name}.taken-{os.getpid()}")
            return True
        except FileNotFoundError:  # another replica took it first
            continue
    return False


class ChaosAsyncGenerator(AsyncVllmGenerator):
    def __init__(self, *args, chaos_dir: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chaos_dir = chaos_dir
        self._failing_calls = 0

    async def generate(self, requests, sampling):
        if claim(self.chaos_dir, "engine_error"):
            self._failing_calls += ENGINE_ERROR_CALLS
        if self._failing_calls > 0:
            self._failing_calls -= 1
            ids = ", ".join(r.request_id for r in requests)
            raise RuntimeError(f"injected engine error (chaos) on request {ids}")
        return await super().generate(requests, sampling)

    async def update_weights(self, version, source, mode=None):
        if not claim(self.chaos_dir, "weight_round"):
            return await super().update_weights(version, source, mode)

        async def load(engine) -> None:
            """The round's first bucket into the workers' open reload, then a failure: the reload
            is aborted (each module keeps its old weights unless finished) and the error raised."""
            from actors.generation.weight_worker import weight_records

            await engine.collective_rpc("begin_weight_records")
            try:
                if isinstance(source, WeightManifest) and source.buckets:
                    first = await fetch_bucket_async(source, 0, "chaos weight round", self.update_timeout_s)
                    await engine.collective_rpc("load_weight_records", kwargs={"records": weight_records(first)})
                raise RuntimeError(f"injected weight round failure (chaos): v{version} failed after its first bucket")
            except BaseException:
                await engine.collective_rpc("abort_weight_records")
                raise

        return await self._update(version, mode, load)
