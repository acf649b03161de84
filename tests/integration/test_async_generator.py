"""The async-engine replica (actors/generation/async_vllm_engine.py) on real vLLM CPU with the tiny model.

One replica and one blocking engine for the module; the replica's coroutines
run on one event loop thread, as they do inside a Ray async actor.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rollout.generator import GenerationRequest, SamplingConfig

PROMPT = [1, 17, 4021, 88, 913, 2049, 31, 7, 605, 12]


class Loop:
    """An event loop on a thread of its own; ``run`` waits, ``submit`` does not."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float = 300):
        return self.submit(coro).result(timeout)


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
        max_model_len=2048,
        cpu_kv_cache_gb=1,
        dtype="float32",
        weight_sync="broadcast",
        update_timeout_s=600.0,
    )
    loop.run(gen.max_model_len())
    yield gen, loop
    loop.run(gen.close())


@pytest.fixture(scope="module")
def tiny_weights(tiny_path):
    import glob

    from safetensors.torch import load_file

    sd = {}
    for f in sorted(glob.glob(f"{tiny_path}/*.safetensors")):
        sd.update(load_file(f))
    return sd


def _req(rid: str, n: int, seed: int = 1, prompt=PROMPT) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), n, seed)


def test_a_short_request_after_a_long_one_finishes_first(replica):
    gen, loop = replica
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=600)
    done: dict[str, float] = {}

    async def timed(req):
        out = (await gen.generate([req], sampling))[0]
        done[req.request_id] = time.perf_counter()
        return out

    long = loop.submit(timed(_req("long", 600)))
    time.sleep(0.5)
    short = loop.submit(timed(_req("short", 8)))
    outs = {o.request_id: o for o in (long.result(300), short.result(300))}
    assert len(outs["short"].token_ids) == 8
    assert done["short"] < done["long"], "continuous batching: the short request must not wait for the long one"
    assert len(outs["long"].token_ids) > 100  # it was still decoding when the short one finished


def test_greedy_matches_the_blocking_engine(replica, tiny_path):
    from actors.generation.vllm_engine import VllmGenerator

    gen, loop = replica
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    blocking = VllmGenerator(tiny_path, max_model_len=2048, cpu_kv_cache_gb=1, dtype="float32")
    try:
        ref = blocking.generate([_req("b", 24, seed=None)], greedy)[0]
    finally:
        blocking.close()
    one = loop.run(gen.generate([_req("a", 24, seed=None)], greedy))[0]
    assert one.token_ids == ref.token_ids
    assert max(abs(a - b) for a, b in zip(one.logprobs, ref.logprobs)) < 1e-4
    # The same request among others (different batch shapes): same tokens, logprobs within 1e-3.
    others = [_req(f"o{i}", 24 + 8 * i, seed=None, prompt=PROMPT[: 4 + i]) for i in range(4)]
    batched = loop.run(gen.generate([_req("a2", 24, seed=None), *others], greedy))[0]
    assert batched.token_ids == ref.token_ids
    assert max(abs(a - b) for a, b in zip(batched.logprobs, ref.logprobs)) < 1e-3
    assert one.spans == () and one.policy_version == loop.run(_call(gen.policy_version))


async def _call(fn):
    return fn()


def test_the_replica_is_a_generator_with_the_engines_tokenizer(replica, tiny_path):
    from rollout.generator import Generator
    from weights.model_assets import load_tokenizer

    gen, _ = replica
    assert isinstance(gen, Generator)
    assert gen.tokenizer.encode("hello world") == load_tokenizer(tiny_path).encode("hello world")


def _perturbed(weights: dict, scale: float) -> dict:
    return {k: v * scale for k, v in weights.items()}


@pytest.mark.parametrize("mode", ["pause", "keep", "abort"])
def test_update_modes_stamp_each_span_with_its_version(replica, tiny_weights, mode):
    gen, loop = replica
    before = loop.run(_call(gen.policy_version))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=1500)
    running = loop.submit(gen.generate([_req(f"long-{mode}", 1500)], sampling))
    time.sleep(1.0)  # tokens under the old weights first (1500 take ~10 s here)
    seconds = loop.run(gen.update_weights(before + 1, _perturbed(tiny_weights, 1.0 + 0.01 * (before + 1)), mode=mode))
    out = running.result(300)[0]
    spans = out.version_spans()
    assert spans[0].start == 0 and spans[-1].end == len(out.token_ids)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
    assert out.policy_version == before  # staleness counts the oldest span
    if mode == "pause":  # the request finished on the old weights before they changed
        assert [s.policy_version for s in spans] == [before] and out.finish_reason == "length"
        assert len(out.token_ids) == 1500
    else:  # keep: frozen and continued; abort: aborted, its partial output continued
        assert [s.policy_version for s in spans] == [before, before + 1], spans
        assert len(out.token_ids) == 1500 and out.finish_reason == "length"
        assert len(out.logprobs) == 1500
    assert seconds > 0
    after = loop.run(gen.generate([_req(f"after-{mode}", 8)], SamplingConfig(max_new_tokens=8)))[0]
    assert after.policy_version == before + 1 and after.spans == ()
    stats = gen.stats()
    assert stats.outstanding == 0 and stats.outstanding_tokens == 0
    if mode == "abort":
        assert stats.continued >= 1


def _hf_logprobs(tiny_path, weights) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, torch_dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(PROMPT[1:])[:, None])[:, 0].tolist()


def test_logprobs_after_an_update_equal_an_hf_forward_at_those_weights(replica, tiny_weights, tiny_path):
    gen, loop = replica
    version = loop.run(_call(gen.policy_version)) + 1
    new = _perturbed(tiny_weights, 0.97)
    loop.run(gen.update_weights(version, new))
    got = loop.run(gen.prompt_logprobs(PROMPT))
    want = _hf_logprobs(tiny_path, new)
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def _one_round_over_a_new_group(gen, loop, weights) -> tuple[int, int]:
    """A new weight group (the learner's broadcaster as rank 0, the replica's worker rank 1) and one
    round over it: (the version loaded, what the replica reported receiving)."""
    import socket

    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import weight_metadata

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    joined = loop.submit(gen.join_weight_group("127.0.0.1", port, 2, "gloo", 1, 60.0))
    sender = WeightBroadcaster("127.0.0.1", port, 2, "gloo", timeout_s=60)
    try:
        assert joined.result(120) == [1]
        version = loop.run(_call(gen.policy_version)) + 1
        received = loop.submit(
            gen.update_weights_from_group(version, [m.to_wire() for m in weight_metadata(weights.items())])
        )
        sender.broadcast(weights)
        count = received.result(120)
    finally:
        sender.close()
    return version, count


def test_weights_through_vllms_weight_transfer_interface_on_gloo(replica, tiny_weights, tiny_path):
    """seal_gloo, registered in vLLM's factory: the learner's broadcaster as rank 0, the replica's worker rank 1."""
    gen, loop = replica
    new = _perturbed(tiny_weights, 1.03)
    version, received = _one_round_over_a_new_group(gen, loop, new)
    assert received > 0
    assert loop.run(_call(gen.policy_version)) == version
    got, want = loop.run(gen.prompt_logprobs(PROMPT)), _hf_logprobs(tiny_path, new)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_bad_update_mode_is_refused_before_anything_changes(replica, tiny_weights):
    gen, loop = replica
    v = loop.run(_call(gen.policy_version))
    with pytest.raises(ValueError, match="update mode must be one of"):
        loop.run(gen.update_weights(v + 1, tiny_weights, mode="later"))
    with pytest.raises(ValueError, match="older than the loaded"):
        loop.run(gen.update_weights(v - 1, tiny_weights))
    assert loop.run(_call(gen.policy_version)) == v


class _Blocking:
    """The Generator interface over the replica's coroutines (what RemoteGenerator is over its actor)."""

    def __init__(self, gen, loop, tokenizer) -> None:
        self.gen, self.loop, self.tokenizer, self.max_model_len = gen, loop, tokenizer, 2048
        self.calls = 0

    @property
    def policy_version(self) -> int:
        return self.loop.run(_call(self.gen.policy_version))

    def generate(self, requests, sampling):
        self.calls += 1
        return self.loop.run(self.gen.generate(requests, sampling))


def test_a_group_plays_its_episodes_independently(replica, tiny_path):
    from env_pool.toy.env import ToyToolEnv
    from rollout.chat import ChatTokenizer
    from rollout.play import GroupStats, run_group
    from weights.model_assets import load_tokenizer

    gen, loop = replica
    tok = load_tokenizer(tiny_path)
    client = _Blocking(gen, loop, tok)
    stats = GroupStats()
    group = run_group(
        lambda: ToyToolEnv(),
        client,
        ChatTokenizer(tok),
        "toy_0",
        4,
        SamplingConfig(max_new_tokens=32),
        seed=3,
        stats=stats,
        lockstep=False,
    )
    assert len(group) == 4 and len({t.group_id for t in group}) == 1
    for t in group:
        t.validate()
        assert t.num_steps >= 1 and all(s.policy_version == t.start_version for s in t.segments)
    # One call per turn of each episode, not one per step of the group.
    assert client.calls == sum(t.num_steps for t in group) and stats.generated_tokens > 0


LONG_PROMPT = [100 + (37 * i) % 4000 for i in range(600)]  # several KV blocks whatever the CPU block size


def _hf_next_logprob(tiny_path, weights, prompt, token) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, torch_dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    return float(torch.log_softmax(logits, -1)[token])


def test_keep_update_with_requests_in_flight_never_serves_prefixes_cached_under_old_weights(
    replica, tiny_weights, tiny_path
):
    """vLLM refuses the prefix-cache reset while the kept request holds blocks; a request issued
    after the update must still compute its prefix under the new weights (cache_salt per version)."""
    gen, loop = replica
    before = loop.run(_call(gen.policy_version))
    refused = gen.stats().prefix_cache_reset_refused
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)
    warm = loop.run(gen.generate([_req("warm", 1, seed=None, prompt=LONG_PROMPT)], greedy))[0]
    again = loop.run(gen.generate([_req("warm-again", 1, seed=None, prompt=LONG_PROMPT)], greedy))[0]
    assert again.cached_prompt_tokens > 0  # LONG_PROMPT's blocks are cached under the old weights
    running = loop.submit(gen.generate([_req("kept", 1500)], SamplingConfig(temperature=1.0, max_new_tokens=1500)))
    time.sleep(1.0)
    new = _perturbed(tiny_weights, 1.05)
    loop.run(gen.update_weights(before + 1, new, mode="keep"))
    after = loop.run(gen.generate([_req("after", 1, seed=None, prompt=LONG_PROMPT)], greedy))[0]
    assert after.policy_version == before + 1
    want = _hf_next_logprob(tiny_path, new, LONG_PROMPT, after.token_ids[0])
    assert abs(warm.logprobs[0] - want) > 1e-3  # the old weights' answer differs: the checks below can fail
    assert after.cached_prompt_tokens == 0, "a prefix cached under the old weights served the new version"
    assert abs(after.logprobs[0] - want) < 1e-3
    assert gen.stats().prefix_cache_reset_refused == refused + 1  # the kept request held its blocks
    reuse = loop.run(gen.generate([_req("after-again", 1, seed=None, prompt=LONG_PROMPT)], greedy))[0]
    assert reuse.cached_prompt_tokens > 0 and abs(reuse.logprobs[0] - want) < 1e-3  # caching within a version stays
    kept = running.result(300)[0]
    assert [s.policy_version for s in kept.version_spans()] == [before, before + 1]


def test_a_pause_update_drains_no_longer_than_its_bound(replica, tiny_weights):
    """A request longer than the drain bound is aborted at the bound and continued on the new
    weights (as in abort mode), so a broadcast round never outwaits the drain."""
    gen, loop = replica
    before = loop.run(_call(gen.policy_version))
    stats0 = gen.stats()
    bound, gen._drain_timeout_s = getattr(gen, "_drain_timeout_s", None), 1.0  # the default: half the update timeout
    try:
        running = loop.submit(
            gen.generate([_req("long-drain", 1500)], SamplingConfig(temperature=1.0, max_new_tokens=1500))
        )
        time.sleep(1.0)
        loop.run(gen.update_weights(before + 1, _perturbed(tiny_weights, 1.0 + 0.01 * (before + 1)), mode="pause"))
        out = running.result(300)[0]
    finally:
        gen._drain_timeout_s = bound
    assert [s.policy_version for s in out.version_spans()] == [before, before + 1]
    assert len(out.token_ids) == 1500 and out.finish_reason == "length"
    stats = gen.stats()
    assert stats.continued == stats0.continued + 1
    assert stats.drain_timeouts == stats0.drain_timeouts + 1


def test_a_drain_bound_not_below_the_learners_ready_wait_is_refused(replica):
    gen, loop = replica
    # Below the group's timeout is not enough: the learner waits half of it for the replica's "ready".
    bound, gen._drain_timeout_s = gen._drain_timeout_s, 40.0
    try:
        with pytest.raises(ValueError, match="below 0.5 of the weight group's timeout"):
            loop.run(gen.join_weight_group("127.0.0.1", 1, 2, "gloo", 1, 60.0))
    finally:
        gen._drain_timeout_s = bound


def test_a_reformed_weight_group_closes_the_engines_old_one_first(replica, tiny_weights, tiny_path):
    """Re-forming (a replica restored, the learner restarted) goes through vLLM's
    shutdown_weight_transfer_engine: vLLM's NCCL engine would otherwise keep the old
    communicator, and seal_gloo refuses a second group over an open one to show it on CPU."""
    gen, loop = replica
    _one_round_over_a_new_group(gen, loop, _perturbed(tiny_weights, 1.01))
    new = _perturbed(tiny_weights, 0.99)
    version, _ = _one_round_over_a_new_group(gen, loop, new)
    assert loop.run(_call(gen.policy_version)) == version
    got, want = loop.run(gen.prompt_logprobs(PROMPT)), _hf_logprobs(tiny_path, new)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def _receive_then_exit(port: int, metadata: list, after: int) -> None:
    """Rank 2 of a weight group beside the replica: receives ``after`` tensors of a round, then its
    process ends (a replica crashing mid-round)."""
    import os

    import torch

    from weights.broadcast_group import WeightGroup, WeightMeta

    group = WeightGroup("127.0.0.1", port, 2, 3, "gloo", "cpu", 3600.0, label="test receiver (dies)")
    group.begin_round()
    for m in [WeightMeta.from_wire(x) for x in metadata][:after]:
        group.broadcast(torch.empty(m.shape, dtype=m.torch_dtype), m.name)
    os._exit(0)


def test_a_round_rank_0_abandons_ends_the_surviving_replicas_update_and_frees_it(replica, tiny_weights, tiny_path):
    """Issue 38 item 2: the replica's side of the group bounded at an hour, the other receiver killed
    mid-round. Rank 0 gives the round up; the surviving replica's update must end (failed) instead of
    waiting out its receive, and its update lock must be free for the next round. On gloo a closed
    peer is an error at once; on CUDA seal_nccl's watchdog (vLLM's NCCL engine had no bound)."""
    import multiprocessing as mp
    import socket

    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import WeightGroupError, weight_metadata

    gen, loop = replica
    new = _perturbed(tiny_weights, 1.04)
    metadata = [m.to_wire() for m in weight_metadata(new.items())]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dies = mp.get_context("spawn").Process(target=_receive_then_exit, args=(port, metadata, 3), daemon=True)
    dies.start()
    joined = loop.submit(gen.join_weight_group("127.0.0.1", port, 3, "gloo", 1, 3600.0))
    sender = WeightBroadcaster("127.0.0.1", port, 3, "gloo", timeout_s=60, op_timeout_s=10)
    before = loop.run(_call(gen.policy_version))
    try:
        assert joined.result(120) == [1]
        received = loop.submit(gen.update_weights_from_group(before + 1, metadata))
        with pytest.raises(WeightGroupError):
            sender.broadcast(new)
        with pytest.raises(Exception):  # noqa: B017 (vLLM wraps the worker's WeightGroupError)
            received.result(300)
    finally:
        sender.close()
        dies.kill()
        dies.join(10)
    assert loop.run(_call(gen.policy_version)) == before
    version, _ = _one_round_over_a_new_group(gen, loop, _perturbed(tiny_weights, 1.02))
    assert loop.run(_call(gen.policy_version)) == version
