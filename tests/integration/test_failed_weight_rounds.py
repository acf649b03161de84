"""A weight round that fails part way leaves no half-loaded module (issue 46 items 2-4), on real vLLM
CPU with the tiny model: the async replica's seal_gloo receive, the blocking engine's broadcast
receive and the object-store (records) load.

The failing round carries layer 0's whole down_proj (a module vLLM processes at once: it then holds
the new version), then q_proj (one shard of the fused qkv_proj: buffered until k and v come), then a
tensor no module has: the load raises with qkv_proj begun. Before, the round was finalized as it
stood: qkv_proj materialised with the new q and k/v whatever the allocator held (seal_gloo), or the
reload was left open with every module not reached on the meta device (the blocking engine; the
records load). Now every module holds the old version or the new one: the model is the old weights
with the new down_proj, which an HF forward of exactly those weights confirms.

The engines (items 2-4, their side): such a model is a mix of two versions, so a failed load aborts the
async replica's requests in flight (keep mode froze them: they went on on the mix, labelled with the old
version) and either engine holds every request until a whole version lands.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.integration.test_async_generator import (  # noqa: F401 (replica, tiny_path, tiny_weights: fixtures)
    PROMPT,
    _call,
    _hf_logprobs,
    _one_round_over_a_new_group,
    _perturbed,
    _req,
    replica,
    tiny_path,
    tiny_weights,
)
from tests.integration.test_weight_sync import HOST, free_port

DOWN, Q = "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"


def new_version(old: dict) -> dict:
    """Every weight scaled; layer 0's down_proj turned around, so its arrival alone shows in the logprobs."""
    return {**_perturbed(old, 1.1), DOWN: -2.0 * old[DOWN]}


def failing_round(new: dict) -> list[tuple[str, torch.Tensor]]:
    return [(DOWN, new[DOWN]), (Q, new[Q]), ("model.layers.0.no_such.weight", torch.zeros(3))]


def assert_old_with_the_new_down_proj(got: list[float], tiny_path: str, old: dict, new: dict) -> None:
    want = _hf_logprobs(tiny_path, {**old, DOWN: new[DOWN]})
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < 1e-3
    neither = _hf_logprobs(tiny_path, old)  # the checks can fail: the new down_proj moves the logprobs
    assert max(abs(a - b) for a, b in zip(got, neither)) > 1e-2


def test_a_failed_seal_gloo_round_leaves_each_module_old_or_new(replica, tiny_weights, tiny_path):
    """Item 2: the async replica's receive (actors/generation/weight_transfer.py) aborts the reload."""
    gen, loop = replica
    loop.run(gen.update_weights(loop.run(_call(gen.policy_version)) + 1, tiny_weights))  # the old version, known
    version = loop.run(_call(gen.policy_version))
    new = new_version(tiny_weights)
    with pytest.raises(Exception, match="no_such"):
        _one_round_over_a_new_group(gen, loop, dict(failing_round(new)))
    assert loop.run(_call(gen.policy_version)) == version
    assert_old_with_the_new_down_proj(loop.run(gen.prompt_logprobs(PROMPT)), tiny_path, tiny_weights, new)
    # and a whole round afterwards loads whole (no module left open with stale counts)
    loop.run(gen.update_weights(version + 1, new))
    got, want = loop.run(gen.prompt_logprobs(PROMPT)), _hf_logprobs(tiny_path, new)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_a_failed_keep_round_aborts_the_requests_in_flight_and_holds_the_replica(replica, tiny_weights, tiny_path):
    """Items 2 and 4, the engine: keep mode froze a request for the round; the round fails part way.
    Before, the frozen request resumed on the mixed model (its tokens labelled with the old version)
    and new requests were served on it. Now the engine holds no request (aborted), the replica holds
    every request (awaiting_weights, which the fleet restores), the canary still reads the weights
    loaded (old or new per module), and a whole version sets both going again on it."""
    from rollout.generator import SamplingConfig

    gen, loop = replica
    loop.run(gen.update_weights(loop.run(_call(gen.policy_version)) + 1, tiny_weights))  # the old version, known
    before, new = loop.run(_call(gen.policy_version)), new_version(tiny_weights)
    failed = gen.stats().failed_updates
    frozen = loop.submit(gen.generate([_req("frozen", 1500)], SamplingConfig(temperature=1.0, max_new_tokens=1500)))
    time.sleep(1.0)  # tokens under the old weights first (1500 take ~10 s here)
    mode, gen.update_mode = gen.update_mode, "keep"
    try:
        with pytest.raises(Exception, match="no_such"):
            _one_round_over_a_new_group(gen, loop, dict(failing_round(new)))
    finally:
        gen.update_mode = mode
    assert loop.run(_call(gen._engine.get_num_unfinished_requests)) == 0, "the frozen request went on on the mix"
    assert gen.awaiting_weights() and gen.stats().failed_updates == failed + 1
    held = loop.submit(gen.generate([_req("held", 8)], SamplingConfig(max_new_tokens=8)))
    assert_old_with_the_new_down_proj(loop.run(gen.prompt_logprobs(PROMPT)), tiny_path, tiny_weights, new)
    time.sleep(1.0)
    assert not frozen.done() and not held.done() and gen.stats().outstanding == 2
    loop.run(gen.update_weights(before + 1, new))  # what the fleet's restore sends
    out, after = frozen.result(300)[0], held.result(300)[0]
    assert [s.policy_version for s in out.version_spans()] == [before, before + 1], out.version_spans()
    assert len(out.token_ids) == 1500 and after.policy_version == before + 1 and not gen.awaiting_weights()


def test_an_update_refused_before_any_load_holds_nothing(replica, tiny_weights):
    """A refusal (an older version) loads nothing: the replica keeps serving."""
    gen, loop = replica
    v = loop.run(_call(gen.policy_version))
    with pytest.raises(ValueError, match="older than the loaded"):
        loop.run(gen.update_weights(v - 1, tiny_weights))
    assert not gen.awaiting_weights()


@pytest.fixture(scope="module")
def blocking(tiny_path):
    from actors.generation.vllm_engine import VllmGenerator

    gen = VllmGenerator(tiny_path, max_model_len=2048, cpu_kv_cache_gb=1, dtype="float32", weight_sync="broadcast")
    yield gen
    gen.close()


def test_a_failed_records_load_leaves_each_module_old_or_new(blocking, tiny_weights, tiny_path):
    """Item 4: a load of records (a restore from the object store) that fails aborts the workers'
    reload (actors/generation/sources.py); left open, the next forward met modules on the meta device."""
    blocking.update_weights(blocking.policy_version + 1, tiny_weights)
    new = new_version(tiny_weights)
    with pytest.raises(Exception, match="no_such"):
        blocking.update_weights(blocking.policy_version + 1, dict(failing_round(new)))
    assert_old_with_the_new_down_proj(blocking.prompt_logprobs(PROMPT), tiny_path, tiny_weights, new)
    blocking.update_weights(blocking.policy_version + 1, new)  # a whole load afterwards loads whole
    got, want = blocking.prompt_logprobs(PROMPT), _hf_logprobs(tiny_path, new)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_a_failed_broadcast_receive_leaves_each_module_old_or_new(blocking, tiny_weights, tiny_path):
    """Item 3: the blocking engine's receive (vLLM's reload_weights has no finally) aborts the reload."""
    import threading

    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import weight_metadata

    blocking.update_weights(blocking.policy_version + 1, tiny_weights)
    version, new = blocking.policy_version, new_version(tiny_weights)
    port, box = free_port(), {}
    opener = threading.Thread(target=lambda: box.update(b=WeightBroadcaster(HOST, port, 2, "gloo", timeout_s=20)))
    opener.start()
    blocking.init_weight_group(HOST, port, world_size=2, timeout_s=20)
    opener.join()
    try:
        for named, fails in ((failing_round(new), True), (list(new.items()), False)):
            sender = threading.Thread(target=lambda: box.update(s=box["b"].broadcast(named)), daemon=True)
            box.pop("s", None)
            sender.start()
            if fails:  # one tensor at a time: qkv_proj is begun when the unknown tensor fails the load
                with pytest.raises(Exception, match="no_such"):
                    blocking.update_weights_from_group(version + 1, weight_metadata(named), bucket_mb=0)
                got = blocking.prompt_logprobs(PROMPT)
                assert_old_with_the_new_down_proj(got, tiny_path, tiny_weights, new)
            else:
                blocking.update_weights_from_group(version + 1, weight_metadata(named))
            sender.join(timeout=10)
            assert "s" in box, "the sender is stuck"
    finally:
        box["b"].close()
    got, want = blocking.prompt_logprobs(PROMPT), _hf_logprobs(tiny_path, new)
    assert blocking.policy_version == version + 1 and max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_the_blocking_server_holds_its_requests_after_a_failed_load(blocking, tiny_weights):
    """Item 3, the engine: GeneratorServer served the next batch on the mix of two versions a failed
    load left. Now it holds generate calls (awaiting_weights, which the fleet restores) until a whole
    version lands; an update refused before any load holds nothing."""
    from actors.generation.server import GeneratorServer
    from rollout.generator import SamplingConfig

    server = GeneratorServer(lambda: blocking)
    blocking.update_weights(blocking.policy_version + 1, tiny_weights)
    version, new = blocking.policy_version, new_version(tiny_weights)
    with pytest.raises(ValueError, match="older than the loaded"):
        server.update_weights(version - 1, tiny_weights)
    assert not server.awaiting_weights()
    with pytest.raises(Exception, match="no_such"):
        server.update_weights(version + 1, dict(failing_round(new)))
    assert server.awaiting_weights() and not blocking.weights_whole
    out: dict = {}
    sampling = SamplingConfig(max_new_tokens=4)
    caller = threading.Thread(target=lambda: out.setdefault("r", server.generate([_req("held", 4)], sampling)))
    caller.start()
    caller.join(2.0)
    assert "r" not in out, "a batch was served on the mix of two versions"
    server.update_weights(version + 1, new)
    caller.join(120)
    assert out["r"][0].policy_version == version + 1 and not server.awaiting_weights() and blocking.weights_whole
