"""A LoRA learner's publishes (learner.cfg.lora.publish: adapter) carry the adapter alone through both
weight-sync paths: the object store's manifest and the broadcast group deliver tensors equal to the
learner's own (``adapter_tensors``: peft's names, B scaled by alpha / rank), in the generator's dtype;
``publish: merged`` still sends the whole model under the base's names. The replica's side of both
paths: tests/integration/test_lora_async_generation.py.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest
import torch

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.lora import adapter_tensors
from tests.integration.test_learner_engine import make_batch
from tests.integration.test_learner_lora import lora_learner


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="module")
def learner(tiny_path):
    lrn = lora_learner(tiny_path)
    lrn.train_batch(make_batch(1, tiny_path), RELEASED_BASE_WEIGHTS)  # B off its zero start
    return lrn


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def assert_equal_tensors(got, want):
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_object_store_path_carries_the_adapter_alone(learner, ray_local, dtype):
    from weights.buckets import fetch_buckets

    want = adapter_tensors(learner.model, getattr(torch, dtype))
    assert any(n.endswith("lora_B.weight") and t.abs().sum() > 0 for n, t in want.items())
    manifest = learner.weights_out.weight_manifest(dtype)
    got = {}
    for bucket in fetch_buckets(manifest, "test"):
        got.update({n: t.clone() for n, t in bucket.items()})
    assert_equal_tensors(got, want)
    assert manifest.dtype == dtype and manifest.num_params == len(want)
    base = sum(p.numel() for p in learner.model.parameters() if not p.requires_grad)
    assert manifest.total_bytes * 20 < base * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def test_the_broadcast_group_carries_the_adapter_alone(learner):
    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import WeightGroup, WeightMeta

    want = adapter_tensors(learner.model, torch.bfloat16)
    metadata = learner.weights_out.weight_metadata(torch.bfloat16)
    assert [m.name for m in metadata] == list(want) and {m.dtype for m in metadata} == {"bfloat16"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got: dict[str, torch.Tensor] = {}

    def receive() -> None:  # a generator worker's side of one round
        group = WeightGroup("127.0.0.1", port, 1, 2, "gloo", "cpu", 60.0, label="test receiver")
        try:
            group.begin_round()
            for meta in (WeightMeta.from_wire(m.to_wire()) for m in metadata):
                buf = torch.empty(meta.shape, dtype=meta.torch_dtype)
                group.broadcast(buf, meta.name)
                got[meta.name] = buf
        finally:
            group.close()

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = WeightBroadcaster("127.0.0.1", port, 2, "gloo", timeout_s=60, dtype=torch.bfloat16)
    try:
        assert learner.weights_out.broadcast_weights(sender) >= 0
    finally:
        receiver.join(60)
        sender.close()
    assert_equal_tensors(got, want)


def test_merged_publishes_send_the_whole_model_under_the_bases_names(learner, tiny_path):
    from learner.weight_broadcast import model_metadata
    from tests.integration.test_learner_lora import base_model

    out = learner.weights_out
    adapter_cfg = out.cfg
    out.cfg = replace(adapter_cfg, lora=replace(adapter_cfg.lora, publish="merged"))
    try:
        metadata = out.weight_metadata()
    finally:
        out.cfg = adapter_cfg
    assert metadata == model_metadata(base_model(tiny_path))  # the broadcast round's layout: the base's
