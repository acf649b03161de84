"""Where a generator's weights come from (actors/generation/sources.py), shared by both engines and
both replica kinds: the calls a source turns into on an engine's collective_rpc (recorded here, no
engine), and the pass-through of paths and manifests."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.generation.sources import as_tensors, restarted_by_ray, send_weights, send_weights_async
from weights.buckets import WeightManifest


class Rpc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict | None]] = []

    def __call__(self, method, kwargs=None):
        self.calls.append((method, kwargs))

    async def remote(self, method, kwargs=None):  # an async engine's collective_rpc
        self(method, kwargs)


def test_a_mapping_goes_as_one_bucket_of_records_inside_one_reload():
    import torch

    rpc = Rpc()
    send_weights(rpc, {"w": torch.ones(2, 3)}, "test loader")
    assert [m for m, _ in rpc.calls] == ["begin_weight_records", "load_weight_records", "finish_weight_records"]
    (record,) = rpc.calls[1][1]["records"]
    assert (record["name"], record["dtype"], record["shape"]) == ("w", "float32", [2, 3])
    sent = Rpc()
    asyncio.run(send_weights_async(sent.remote, {"w": torch.ones(2, 3)}, "test loader", 5.0))
    assert sent.calls == rpc.calls


def test_a_directory_goes_by_path_and_a_missing_one_is_refused_before_any_call(tmp_path):
    rpc = Rpc()
    send_weights(rpc, str(tmp_path), "test loader")
    assert rpc.calls == [("reload_weights", {"weights_path": str(tmp_path)})]
    with pytest.raises(FileNotFoundError, match="weights directory not found"):
        send_weights(rpc, str(tmp_path / "gone"), "test loader")
    with pytest.raises(FileNotFoundError, match="weights directory not found"):
        asyncio.run(send_weights_async(Rpc().remote, str(tmp_path / "gone"), "test loader", 5.0))
    assert len(rpc.calls) == 1


def test_arrays_become_tensors_over_the_same_memory_and_paths_and_manifests_pass_through():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    arrays["w"].setflags(write=False)  # as they come out of Ray's object store
    tensors = as_tensors(arrays)
    assert tensors["w"].data_ptr() == arrays["w"].ctypes.data
    manifest = WeightManifest(
        buckets=("ref",), bucket_nbytes=(24,), dtype="float32", num_params=1, num_elements=6, bucket_mb=1.0
    )  # a stand-in ref: as_tensors never reads it
    assert as_tensors(manifest) is manifest and as_tensors("/some/dir") == "/some/dir"


def test_outside_a_ray_actor_nothing_was_restarted():
    assert restarted_by_ray() is False


class FailingRpc(Rpc):
    """An engine whose load of records fails (a bad record) or never ends (cancelled by the update's bound)."""

    def __init__(self, hang: bool = False) -> None:
        super().__init__()
        self.hang = hang

    def __call__(self, method, kwargs=None):
        super().__call__(method, kwargs)
        if method == "load_weight_records":
            raise KeyError("model.layers.0.no_such.weight")

    async def remote(self, method, kwargs=None):
        if method == "load_weight_records" and self.hang:
            self.calls.append((method, kwargs))
            await asyncio.sleep(3600)
        self(method, kwargs)


def test_a_load_that_fails_or_is_cancelled_aborts_the_workers_reload_before_it_raises():
    """Issue 46 item 4: a failed or cancelled load left the reload open (modules on the meta device:
    the next forward kills the engine). The workers' reload is aborted, never finished, then the error goes on."""
    import torch

    opened = ["begin_weight_records", "load_weight_records", "abort_weight_records"]
    rpc = FailingRpc()
    with pytest.raises(KeyError, match="no_such"):
        send_weights(rpc, {"w": torch.ones(2)}, "test loader")
    assert [m for m, _ in rpc.calls] == opened
    failing = FailingRpc()
    with pytest.raises(KeyError, match="no_such"):
        asyncio.run(send_weights_async(failing.remote, {"w": torch.ones(2)}, "test loader", 5.0))
    assert [m for m, _ in failing.calls] == opened
    hanging = FailingRpc(hang=True)
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(send_weights_async(hanging.remote, {"w": torch.ones(2)}, "test", 5.0), 0.5))
    assert [m for m, _ in hanging.calls] == opened
