"""Learner -> vLLM weight broadcast on CPU (gloo): a ZeRO-3 learner process is rank 0, vLLM here is rank 1.

What arrives by broadcast must act exactly like the same weights loaded
through the existing reload path, and match an HF forward of them.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import socket

import pytest

from rollout.generator import GenerationRequest, SamplingConfig

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def learner_side(model_dir: str, port: int, backend: str, device: str, zero_stage: int, rounds: int, out) -> None:
    """Rank 0 in a process of its own, as the learner runs: its DeepSpeed group is not the weight group."""
    try:
        from learner.engine import Learner, LearnerConfig
        from learner.weight_broadcast import WeightBroadcaster

        cfg = LearnerConfig(
            backend="deepspeed" if zero_stage else "torch",
            zero_stage=zero_stage,
            mini_batch_groups=1,
            micro_batch_size=1,
        )
        learner = Learner(model_dir, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
        out.put(("metadata", learner.weights_out.weight_metadata()))
        broadcaster = WeightBroadcaster(HOST, port, world_size=2, backend=backend, device=device, timeout_s=120)
        seconds = [learner.weights_out.broadcast_weights(broadcaster) for _ in range(rounds)]
        broadcaster.close()
        out.put(("done", seconds))
    except BaseException as exc:  # the test would otherwise wait for a message that never comes
        out.put(("error", repr(exc)))
        raise


def expect(q, kind: str, proc, timeout: float = 120.0):
    try:
        got, payload = q.get(timeout=timeout)
    except queue_mod.Empty:
        raise AssertionError(
            f"learner process sent nothing in {timeout}s (alive={proc.is_alive()}, exit={proc.exitcode})"
        )
    assert got == kind, f"learner process: {got}: {payload}"
    return payload


def start_learner(model_dir, backend="gloo", device="cpu", zero_stage=3, rounds=2):
    ctx = mp.get_context("spawn")  # no fork of a process that holds a vLLM engine
    q, port = ctx.Queue(), free_port()
    proc = ctx.Process(
        target=learner_side, args=(str(model_dir), port, backend, device, zero_stage, rounds, q), daemon=True
    )
    proc.start()
    return proc, q, port


def write_perturbed(tiny_path: str, out_dir) -> str:
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    original = load_file(f"{tiny_path}/model.safetensors")
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    save_file(perturbed, f"{out_dir}/model.safetensors", metadata={"format": "pt"})
    shutil.copy(f"{tiny_path}/config.json", out_dir)
    return str(out_dir)


def greedy(generator):
    from rollout.chat import ChatTokenizer

    prompt = ChatTokenizer(generator.tokenizer).prompt_ids(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    )
    out = generator.generate([GenerationRequest("w", prompt, 12)], SamplingConfig(temperature=0.0, max_new_tokens=12))[
        0
    ]
    return prompt, out


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import resolve_model

    return str(resolve_model("tiny"))


@pytest.fixture(scope="module")
def generator(tiny_path):
    from actors.generation.vllm_engine import VllmGenerator

    gen = VllmGenerator(tiny_path, max_model_len=2048, cpu_kv_cache_gb=1, weight_sync="broadcast")
    yield gen
    gen.close()


def test_broadcast_equals_the_reload_path_and_an_hf_forward(generator, tiny_path, tmp_path):
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from tests.integration.hf_logprobs import sequence_logprobs
    from weights.broadcast_group import WeightMeta

    new_dir = write_perturbed(tiny_path, tmp_path)
    _, before = greedy(generator)
    v0 = generator.policy_version
    with pytest.raises(RuntimeError, match="before init_weight_group"):
        generator.update_weights_from_group(v0 + 1, [])
    proc, q, port = start_learner(new_dir)
    try:
        metadata = expect(q, "metadata", proc)
        names = [m.name for m in metadata]
        assert all(isinstance(m, WeightMeta) for m in metadata) and len(set(names)) == len(names)
        # Tied embeddings go once; ZeRO-3 shapes are the full ones, not the partitions.
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
        embed = metadata[names.index("model.embed_tokens.weight")]
        assert embed.dtype == "float32" and embed.shape[1] == 64 and embed.shape[0] > 1000
        default_world = dist.get_world_size() if dist.is_initialized() else None
        assert generator.init_weight_group(HOST, port, world_size=2, timeout_s=120) == [1]
        assert (dist.get_world_size() if dist.is_initialized() else None) == default_world  # vLLM's own group untouched

        seconds = generator.update_weights_from_group(v0 + 1, metadata)
        prompt, via_broadcast = greedy(generator)
        assert via_broadcast.policy_version == v0 + 1 and seconds < 30
        assert via_broadcast.token_ids != before.token_ids  # the weights did change

        hf = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32).eval()
        ours = sequence_logprobs(hf, list(prompt) + via_broadcast.token_ids)[len(prompt) :]
        assert max(abs(a - b) for a, b in zip(ours, via_broadcast.logprobs)) < 1e-4

        generator.update_weights(v0 + 2, new_dir)  # the same weights by the existing path
        _, via_reload = greedy(generator)
        assert via_reload.token_ids == via_broadcast.token_ids
        assert via_reload.logprobs == pytest.approx(via_broadcast.logprobs, abs=1e-6)

        # The group serves every version: back to the original, then round two overwrites it.
        generator.update_weights(v0 + 3, tiny_path)
        assert greedy(generator)[1].token_ids == before.token_ids
        with pytest.raises(ValueError, match="older"):
            generator.update_weights_from_group(v0 + 2, metadata)
        generator.update_weights_from_group(v0 + 4, metadata)
        _, again = greedy(generator)
        assert again.token_ids == via_broadcast.token_ids and again.policy_version == v0 + 4
        assert again.logprobs == pytest.approx(via_broadcast.logprobs, abs=1e-6)
        learner_seconds = expect(q, "done", proc)
        assert len(learner_seconds) == 2 and all(s > 0 for s in learner_seconds)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


def test_a_round_the_loader_rejects_leaves_the_group_in_step(generator, tiny_path):
    """The sender is not told the load failed: the worker must still take every tensor off the wire."""
    import threading

    import torch
    from safetensors.torch import load_file

    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import weight_metadata

    port, box = free_port(), {}
    opener = threading.Thread(target=lambda: box.update(b=WeightBroadcaster(HOST, port, 2, "gloo", timeout_s=20)))
    opener.start()
    generator.init_weight_group(HOST, port, world_size=2, timeout_s=20)  # a new group replaces the old one
    opener.join()
    weights = load_file(f"{tiny_path}/model.safetensors")
    bad = {"model.layers.0.no_such.weight": torch.zeros(3), **weights}  # rejected first: the rest is still in flight
    version = generator.policy_version
    for named, ok in ((bad, False), (weights, True)):
        sender = threading.Thread(target=lambda: box.update(s=box["b"].broadcast(named)), daemon=True)
        box.pop("s", None)
        sender.start()
        if ok:
            generator.update_weights_from_group(version + 1, weight_metadata(named.items()))
        else:  # one tensor at a time: the load fails while the rest is still to come
            with pytest.raises(ValueError, match="no_such"):
                generator.update_weights_from_group(version + 1, weight_metadata(named.items()), bucket_mb=0)
        sender.join(timeout=10)
        assert "s" in box, "the sender is stuck: the worker left tensors on the wire"
    assert generator.policy_version == version + 1  # only the good round counts
    box["b"].close()


def test_group_calls_need_the_broadcast_setting():
    from actors.generation.vllm_engine import VllmGenerator
    from weights.broadcast_group import WeightGroup, WeightMeta

    with pytest.raises(ValueError, match="weight_sync"):
        VllmGenerator("tiny", weight_sync="nccl")  # refused before any engine starts
    with pytest.raises(ValueError, match="backend"):
        WeightGroup(HOST, free_port(), 0, 2, "mpi", "cpu", timeout_s=60.0)
    with pytest.raises(ValueError, match="dtype"):
        WeightMeta("w", "float33", (2,))
    meta = WeightMeta.from_wire({"name": "w", "dtype": "bfloat16", "shape": [2, 3]})
    assert meta == WeightMeta("w", "bfloat16", (2, 3)) and WeightMeta.from_wire(meta.to_wire()) == meta
