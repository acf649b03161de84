"""LoRA publishes into the async replica (actors/generation/adapter_updates.py) on real vLLM CPU with
the tiny model: the adapter's tensors through the records path and through the broadcast group
arrive equal to the learner's, the replica then scores fixed tokens as the learner does, and a
request in flight at an update finishes on the adapter it started with.

Tolerance, fp32 on both sides: 1e-4 nats per token, as for the blocking engine
(tests/integration/test_lora_generation.py, which measured a largest gap of 0 with an adapter):
vLLM's CPU kernels sum in another order than torch's, and fp32 rounding of ~11-nat log-probs through
the tiny model's two 64-wide layers stays below 1e-5. A publish that did not land (the base or the
previous adapter served) misses by the adapter's effect, asserted to be over 100x the bound.
"""

from __future__ import annotations

import socket
import time

import pytest
import torch

from actors.generation.adapters import read_adapter_files
from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.lora import adapter_tensors
from rollout.generator import GenerationRequest, SamplingConfig
from tests.integration.test_async_generator import Loop
from tests.integration.test_learner_engine import make_batch
from tests.integration.test_learner_lora import lora_learner
from tests.integration.test_lora_generation import TOKENS, gap, learner_base_logprobs

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="module")
def replica(tiny_path):
    from actors.generation.async_vllm_engine import AsyncVllmGenerator

    loop = Loop()
    gen = AsyncVllmGenerator(
        tiny_path,
        max_model_len=512,
        cpu_kv_cache_gb=0.25,
        dtype="float32",
        weight_sync="broadcast",
        max_lora_rank=8,
        update_mode="pause",
        update_timeout_s=600.0,
    )
    loop.run(gen.max_model_len())
    yield gen, loop
    loop.run(gen.close())
    assert not gen.adapters.served.root.exists()  # the adapters' files go with the replica


@pytest.fixture(scope="module")
def learner(tiny_path):
    return lora_learner(tiny_path)


def trained(lrn, tiny_path, version):
    lrn.train_batch(make_batch(version, tiny_path), RELEASED_BASE_WEIGHTS)
    return adapter_tensors(lrn.model)


def served_files(gen, version):
    return read_adapter_files(gen.adapters.served.directory(version))


def assert_same_tensors(got, want):
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def assert_serves_the_learner(gen, loop, lrn, base):
    served = loop.run(gen.prompt_logprobs(TOKENS))
    assert gap(served, lrn.canary_logprobs(TOKENS)) <= TOLERANCE, "vLLM's adapter gives other log-probs"
    assert gap(served, base) > 100 * TOLERANCE, "the adapter changed nothing"


def test_an_adapter_through_the_records_path_is_the_learners(replica, learner, tiny_path):
    gen, loop = replica
    base = learner_base_logprobs(learner)
    assert gap(loop.run(gen.prompt_logprobs(TOKENS)), base) <= TOLERANCE  # the base, before any adapter

    tensors = trained(learner, tiny_path, 1)
    scaled = [n for n in tensors if n.endswith("lora_B.weight")]
    assert scaled and all(tensors[n].abs().sum() > 0 for n in scaled)  # trained: B moved off its zero start
    seconds = loop.run(gen.update_weights(1, tensors))
    assert seconds >= 0 and gen.policy_version() == 1
    assert_same_tensors(served_files(gen, 1), tensors)
    assert_serves_the_learner(gen, loop, learner, base)
    assert gen.adapters.written_bytes < sum(t.numel() * 4 for t in learner.model.parameters()) / 20


def test_an_adapter_through_the_broadcast_group_is_the_learners(replica, learner, tiny_path):
    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import weight_metadata

    gen, loop = replica
    base = learner_base_logprobs(learner)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    joined = loop.submit(gen.join_weight_group("127.0.0.1", port, 2, "gloo", 1, 60.0))
    sender = WeightBroadcaster("127.0.0.1", port, 2, "gloo", timeout_s=60)
    try:
        assert joined.result(120) == [1]
        version = gen.policy_version() + 1
        tensors = trained(learner, tiny_path, version)
        metadata = [m.to_wire() for m in weight_metadata(tensors.items())]
        received = loop.submit(gen.update_weights_from_group(version, metadata))
        sender.broadcast(tensors)  # the round's "ready" handshake first, each tensor bounded
        received.result(120)
    finally:
        sender.close()
    assert gen.policy_version() == version
    assert_same_tensors(served_files(gen, version), tensors)
    assert_serves_the_learner(gen, loop, learner, base)
    assert gen.adapters.served.loaded() == [version]  # no request used the older one: dropped


def test_a_request_in_flight_finishes_on_the_adapter_it_started_with(replica, learner, tiny_path):
    """update_mode pause under adapters: no drain, the old adapter stays while a request uses it."""
    gen, loop = replica
    old = gen.policy_version()
    new = old + 1
    tensors = trained(learner, tiny_path, new)  # before the request: the update must land while it runs
    long = loop.submit(
        gen.generate([GenerationRequest("long", list(TOKENS), 240, 1)], SamplingConfig(temperature=1.0, seed=1))
    )
    while not gen.adapters.served.users(old):  # the request holds its adapter once it is in the engine
        loop.run(_noop())
    loop.run(gen.update_weights(new, tensors))
    assert gen.adapters.served.loaded() == [old, new]  # both held: the old one in use
    short = loop.run(gen.generate([GenerationRequest("short", list(TOKENS), 4, 2)], SamplingConfig(seed=2)))[0]
    assert short.policy_version == new and not short.spans
    out = long.result(300)[0]
    assert out.policy_version == old and not out.spans  # one version: the one it started on
    assert len(out.token_ids) > 0
    loop.run(_noop())
    assert gen.adapters.served.loaded() == [new]  # the old adapter went once unused


async def _noop() -> None:
    import asyncio

    await asyncio.sleep(0.01)


def test_an_abort_update_continues_a_request_on_the_new_adapter(replica, learner, tiny_path):
    """update_mode abort (and keep) under adapters: the request in flight is aborted and continued on
    the new adapter, its tokens so far kept, each span with the adapter version that sampled it."""
    gen, loop = replica
    old, continued = gen.policy_version(), gen.stats().continued
    new = old + 1
    tensors = trained(learner, tiny_path, new)  # before the request: the update must land while it runs
    long = loop.submit(
        gen.generate([GenerationRequest("cut", list(TOKENS), 240, 3)], SamplingConfig(temperature=1.0, seed=3))
    )
    while not gen.adapters.served.users(old):
        loop.run(_noop())
    time.sleep(0.5)  # a few tokens on the old adapter first (240 take a few seconds here)
    loop.run(gen.update_weights(new, tensors, mode="abort"))
    out = long.result(300)[0]
    spans = out.version_spans()
    assert [s.policy_version for s in spans] in ([old, new], [new]), spans  # [new]: aborted before a token
    assert spans[-1].end == len(out.token_ids) == len(out.logprobs) > 0
    assert gen.stats().continued > continued  # aborted by the update and continued, not finished on the old one
    assert gen.adapters.served.loaded() == [new]


def decoding_on_a_new_adapter(gen, loop, learner, tiny_path, tag, seed):
    """A new adapter published, then three requests decoding on it (all in the engine on return):
    (its version, the future of their outputs)."""
    version = gen.policy_version() + 1
    loop.run(gen.update_weights(version, trained(learner, tiny_path, version)))
    busy = loop.submit(
        gen.generate(
            [GenerationRequest(f"{tag}{i}", list(TOKENS), 200, 10 * seed + i) for i in range(3)],
            SamplingConfig(temperature=1.0, seed=seed),
        )
    )
    while gen.adapters.served.users(version) < 3:
        loop.run(_noop())
    return version, busy


def test_the_canary_scores_beside_requests_on_the_adapter(replica, learner, tiny_path):
    """The canary asks for prompt log-probs while episodes run (the main job's case). vLLM computes
    them through the output head's LoRA wrapper with the batch's mapping, one entry per request:
    with other requests in the batch its length differs from the canary's tokens and the engine
    core died (einsum shape error). The engine wraps only the adapter's layers, never the head."""
    gen, loop = replica
    base = learner_base_logprobs(learner)
    version, busy = decoding_on_a_new_adapter(gen, loop, learner, tiny_path, "busy", seed=4)
    assert_serves_the_learner(gen, loop, learner, base)
    assert all(len(out.token_ids) > 0 and out.policy_version == version for out in busy.result(300))


def test_the_base_scores_the_kl_reference_beside_requests_on_the_adapter(replica, learner, tiny_path):
    """trainer.reference_logprobs=generator: sequences scored on the base model (no adapter) while
    episodes decode on the newest adapter are the learner's reference (its policy with the adapter
    off), and not the adapter's log-probs; every sequence of the call is answered whole."""
    gen, loop = replica
    base = learner_base_logprobs(learner)
    version, busy = decoding_on_a_new_adapter(gen, loop, learner, tiny_path, "ref-busy", seed=5)
    whole, again = loop.run(gen.reference_logprobs([TOKENS, list(TOKENS)]))
    assert gap(whole, base) <= TOLERANCE and whole == again
    assert gap(whole, learner.canary_logprobs(TOKENS)) > 100 * TOLERANCE  # the adapter's are other
    assert all(out.policy_version == version for out in busy.result(300))


def test_a_request_on_the_base_stays_on_it_when_the_first_adapter_lands(tiny_path, learner):
    """A request that started before any adapter (policy v0, the base) and decodes on after the
    first publish keeps the base: each sampled token's log-prob is the learner's base log-prob of it.
    (vLLM's CPU kernels would give a request without an adapter the last slot's: ServedAdapters.base.)"""
    from actors.generation.async_vllm_engine import AsyncVllmGenerator
    from tests.integration.hf_logprobs import sequence_logprobs

    loop = Loop()
    gen = AsyncVllmGenerator(
        tiny_path, max_model_len=512, cpu_kv_cache_gb=0.25, dtype="float32", max_lora_rank=8, update_timeout_s=600.0
    )
    try:
        loop.run(gen.max_model_len())
        long = loop.submit(
            gen.generate([GenerationRequest("v0", list(TOKENS), 490, 3)], SamplingConfig(temperature=1.0, seed=3))
        )
        tensors = trained(learner, tiny_path, 1)
        while not gen.counters.outstanding:
            loop.run(_noop())
        loop.run(gen.update_weights(1, tensors))
        assert not long.done(), "the request ended before the adapter landed: nothing tested"
        out = long.result(300)[0]
        assert out.policy_version == 0 and len(out.token_ids) > 20
        with torch.no_grad(), learner.model.disable_adapter():
            base = sequence_logprobs(learner.model, list(TOKENS) + out.token_ids)[len(TOKENS) :]
        worst = max(abs(a - b) for a, b in zip(out.logprobs, base))
        assert worst <= TOLERANCE, f"a token of the v0 request was off the base by {worst:.4f} nats"
    finally:
        loop.run(gen.close())
