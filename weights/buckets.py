"""Weights through Ray's object store in buckets: the manifest the learner returns and the generators load.

The learner's rank 0 gathers the weights bucket by bucket (``weight_bucket_mb``;
under ZeRO-3 one bucket of parameters at a time) and puts each bucket into the
object store as its own object as soon as it is gathered, then drops its host
copy; what it returns is a ``WeightManifest``: the bucket refs in load order
and what they add up to. A generator fetches one bucket, loads it into its
engine and drops it before fetching the next, so neither rank 0 nor a
generator process holds a second full copy of the model (the object store
holds the one published copy; the pipeline keeps the manifest of the last
version, and with it the buckets, for replicas that restore or join later).

A bucket is a name -> numpy array mapping in the wire form of
weights/precision.py (bf16 as int16 bits under a marker key), zero-copy out of
the store. The objects are owned by the learner's rank-0 actor: a dead
learner stops the run, so nothing outlives its owner in a way that matters.

Shared by learner/ and the generators (below both: nothing here imports seal/
or learner/); torch and ray only inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weights.precision import from_wire_arrays, to_wire_arrays

FETCH_TIMEOUT_S = 600.0  # one bucket out of the store; a publish is bounded by the generator's update timeout too


def bucket_bounds(sizes: Sequence[int], bucket_bytes: int) -> list[range]:
    """Consecutive items (their sizes in bytes, in order) grouped into buckets of at most
    ``bucket_bytes``; an item larger than a bucket is a bucket of its own. Index ranges, in order."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    out: list[range] = []
    start, size = 0, 0
    for i, nbytes in enumerate(sizes):
        if nbytes < 0:
            raise ValueError(f"item {i} has a negative size {nbytes}")
        if i > start and size + nbytes > bucket_bytes:
            out.append(range(start, i))
            start, size = i, 0
        size += nbytes
    if len(sizes) > start:
        out.append(range(start, len(sizes)))
    return out


@dataclass(frozen=True)
class WeightManifest:
    """One published version's weights: bucket objects in the store, in load order.

    Holding a manifest keeps its buckets alive (Ray counts the refs inside it).
    """

    buckets: tuple[Any, ...]  # ray.ObjectRef per bucket, each a wire mapping (weights/precision.py)
    bucket_nbytes: tuple[int, ...]  # payload bytes of each bucket, same order
    dtype: str  # what the arrays carry: the generator's dtype (bfloat16 | float32)
    num_params: int  # parameter tensors over all buckets (a tied parameter once)
    num_elements: int
    bucket_mb: float  # the learner's weight_bucket_mb the buckets were cut to

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", tuple(self.buckets))
        object.__setattr__(self, "bucket_nbytes", tuple(int(n) for n in self.bucket_nbytes))
        if not self.buckets:
            raise ValueError("a weight manifest carries at least one bucket")
        if len(self.buckets) != len(self.bucket_nbytes):
            raise ValueError(f"{len(self.buckets)} buckets but {len(self.bucket_nbytes)} sizes")

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_nbytes)

    def describe(self) -> str:
        return (
            f"{self.num_params} tensors, {self.total_bytes / 2**20:.1f} MiB {self.dtype} in {len(self.buckets)} "
            f"buckets (largest {max(self.bucket_nbytes) / 2**20:.2f} MiB; bucket size {self.bucket_mb:g} MB)"
        )


def put_buckets(buckets: Iterator[Sequence[tuple[str, Any]]], dtype: str, bucket_mb: float) -> WeightManifest:
    """Each bucket of (name, host tensor) into the object store as soon as it comes; the
    caller's iterator may reuse or free a bucket's tensors once the next is asked for."""
    import ray

    refs, sizes, params, elements = [], [], 0, 0
    for bucket in buckets:
        wire = to_wire_arrays(bucket)
        nbytes = sum(a.nbytes for a in wire.values() if hasattr(a, "nbytes"))
        refs.append(ray.put(wire))  # a copy into shared memory: the host copy can go now
        sizes.append(nbytes)
        params += len(bucket)
        elements += sum(int(t.numel()) for _, t in bucket)
        del wire, bucket  # before the next bucket is made: one host bucket at a time
    return WeightManifest(tuple(refs), tuple(sizes), dtype, params, elements, float(bucket_mb))


def _tensors(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """A fetched bucket as name -> tensor over the store's read-only memory: the engine copies
    them into its own parameters, so wrapping without a copy is safe."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        return from_wire_arrays(arrays)


def _fetch_error(manifest: WeightManifest, i: int, who: str, timeout_s: float) -> TimeoutError:
    return TimeoutError(
        f"{who}: weight bucket {i + 1}/{len(manifest.buckets)} ({manifest.bucket_nbytes[i]} bytes) "
        f"not fetched from the object store within {timeout_s:g}s"
    )


def fetch_buckets(manifest: WeightManifest, who: str, timeout_s: float = FETCH_TIMEOUT_S) -> Iterator[dict[str, Any]]:
    """The buckets one at a time, as name -> tensor; a bucket is released when the next is asked for
    (unless the consumer keeps its tensors). ``who`` names the loader in errors."""
    import ray

    for i, ref in enumerate(manifest.buckets):
        try:
            arrays = ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise _fetch_error(manifest, i, who, timeout_s) from None
        tensors = _tensors(arrays)
        del arrays
        yield tensors
        del tensors


async def fetch_bucket_async(
    manifest: WeightManifest, i: int, who: str, timeout_s: float = FETCH_TIMEOUT_S
) -> dict[str, Any]:
    """Bucket ``i`` as name -> tensor without blocking the event loop (an async actor keeps serving)."""
    try:
        arrays = await asyncio.wait_for(asyncio.wrap_future(manifest.buckets[i].future()), timeout_s)
    except TimeoutError:
        raise _fetch_error(manifest, i, who, timeout_s) from None
    return _tensors(arrays)
