"""Where a generator's weights come from, shared by both replica kinds (server.py's
``GeneratorServer`` over an engine, async_vllm_engine.py's ``AsyncVllmGenerator``) and both engines.

``as_tensors``: an update's source as the engine loads it. ``send_weights`` /
``send_weights_async``: a source into an engine's workers (vllm_engine.py,
async_vllm_engine.py). ``restarted_by_ray``: a replica Ray restarted after a
crash holds only the base weights, so it must wait for the current ones before
it serves (``await_weights``).
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from weights.buckets import WeightManifest, fetch_bucket_async, fetch_buckets
from weights.precision import from_wire_arrays


def restarted_by_ray() -> bool:
    """True inside a Ray actor that Ray has restarted after a crash."""
    try:
        import ray

        with warnings.catch_warnings():  # the property reads a deprecated accessor internally
            warnings.simplefilter("ignore")
            return ray.is_initialized() and bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except (ImportError, AttributeError, RuntimeError):
        return False


def as_tensors(source: str | Mapping[str, Any] | WeightManifest) -> str | WeightManifest | dict[str, Any]:
    """A name -> numpy array mapping (read-only, zero-copy out of Ray's object store; bf16
    as int16 bits, weights/precision.py) as tensors over the same memory: the engine copies
    them into its own parameters, so wrapping without a copy is safe. A path or a manifest
    (fetched bucket by bucket by the engine) passes through."""
    if isinstance(source, (str, WeightManifest)):
        return source

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        return from_wire_arrays(source)


def _directory(path: str) -> dict[str, str]:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"weights directory not found: {path}")
    return {"weights_path": path}


# What crosses collective_rpc must survive msgpack: the engine core may be a process of its own
# (the async engine's always; the blocking one's on CUDA), so no weights iterator can be handed
# over. Records of raw bytes go, one bucket at a time, into one layerwise reload the workers hold
# open (WeightSyncExtension.begin/load/finish_weight_records): a layer whose weights span two
# buckets is still processed once, whole; held meanwhile: one bucket here and in the workers.
def send_weights(rpc: Callable[..., Any], source: str | Mapping[str, Any] | WeightManifest, who: str) -> None:
    """``source`` into the workers through a blocking engine's ``collective_rpc``: a snapshot
    directory by path, a WeightManifest's buckets (fetched one at a time) or one mapping of tensors.
    ``who`` names the loader in a fetch's errors."""
    from actors.generation.weight_worker import weight_records

    if isinstance(source, str):
        rpc("reload_weights", kwargs=_directory(source))
        return
    buckets = fetch_buckets(source, who) if isinstance(source, WeightManifest) else [source]
    rpc("begin_weight_records")
    try:
        for tensors in buckets:
            records = weight_records(tensors)
            del tensors
            rpc("load_weight_records", kwargs={"records": records})
            del records
    except BaseException:
        _abort_records(rpc)
        raise
    rpc("finish_weight_records")


def _abort_records(rpc: Callable[..., Any]) -> None:
    """A load that failed (a fetch, a bad record) leaves the workers' reload open: the modules not yet
    loaded on the meta device, which the next forward would die on. Abort it: each module keeps its
    old weights unless the load had finished it (WeightSyncExtension.abort_weight_records)."""
    try:
        rpc("abort_weight_records")
    except Exception:  # the load's own error is the one to report
        pass


async def send_weights_async(
    rpc: Callable[..., Awaitable[Any]], source: str | Mapping[str, Any] | WeightManifest, who: str, timeout_s: float
) -> None:
    """``send_weights`` through an async engine's ``collective_rpc``; each bucket fetch is awaited
    (within ``timeout_s``), so the actor's event loop keeps serving meanwhile."""
    from actors.generation.weight_worker import weight_records

    if isinstance(source, str):
        await rpc("reload_weights", kwargs=_directory(source))
        return
    await rpc("begin_weight_records")
    try:
        if isinstance(source, WeightManifest):
            for i in range(len(source.buckets)):
                records = weight_records(await fetch_bucket_async(source, i, who, timeout_s))
                await rpc("load_weight_records", kwargs={"records": records})
                del records
        else:
            await rpc("load_weight_records", kwargs={"records": weight_records(source)})
    except BaseException:  # a cancelled load too (the update's timeout): the abort is awaited within a bound
        try:
            await asyncio.wait_for(rpc("abort_weight_records"), timeout_s)
        except Exception:  # the load's own error (or cancellation) is the one to report
            pass
        raise
    await rpc("finish_weight_records")
