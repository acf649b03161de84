"""The CUDA generator path (vLLM CUDA build): runs wherever CUDA and vLLM are installed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_cuda_generator_generates_and_swaps_weights():
    pytest.importorskip("vllm")
    from actors.generation.vllm_engine import VllmGenerator
    from rollout.chat import ChatTokenizer
    from rollout.generator import GenerationRequest, SamplingConfig
    from weights.model_assets import prepare_tiny_model

    path = str(prepare_tiny_model())
    gen = VllmGenerator(path, device="cuda", dtype="float32", max_model_len=4096, gpu_memory_utilization=0.3)
    chat = ChatTokenizer(gen.tokenizer)
    prompt = chat.prompt_ids([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    first = gen.generate([GenerationRequest("a", prompt, 8)], greedy)[0]
    gen.update_weights(1, path)
    again = gen.generate([GenerationRequest("b", prompt, 8)], greedy)[0]
    assert again.token_ids == first.token_ids and again.policy_version == 1
    gen.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_async_replica_takes_weights_through_the_seal_nccl_engine(tp):
    """seal_nccl, our NCCL weight-transfer engine in vLLM's factory, fed by the learner's broadcaster as rank 0,
    the replica's TP workers ranks 1..tp; logprobs after the update equal an HF forward."""
    pytest.importorskip("vllm")
    import asyncio
    import socket
    import threading

    import torch

    if torch.cuda.device_count() < tp + 1:
        pytest.skip(f"needs {tp + 1} GPUs (the learner's rank 0 and {tp} TP workers)")
    from transformers import AutoModelForCausalLM

    from actors.generation.async_vllm_engine import AsyncVllmGenerator
    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import weight_metadata
    from weights.model_assets import prepare_tiny_model

    path = str(prepare_tiny_model())
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(300)
    gen = AsyncVllmGenerator(
        path,
        device="cuda",
        dtype="float32",
        max_model_len=2048,
        tensor_parallel_size=tp,
        gpu_memory_utilization=0.3,
        weight_sync="broadcast",
        update_timeout_s=600.0,
    )
    run(gen.max_model_len())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(tp)  # the learner's rank 0 on a GPU of its own
    joined = asyncio.run_coroutine_threadsafe(gen.join_weight_group("127.0.0.1", port, tp + 1, "nccl", 1, 120.0), loop)
    sender = WeightBroadcaster("127.0.0.1", port, tp + 1, "nccl", device=f"cuda:{tp}", timeout_s=120)
    assert joined.result(300) == list(range(1, tp + 1))
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    new = {k: v * 1.02 for k, v in model.state_dict().items()}
    received = asyncio.run_coroutine_threadsafe(
        gen.update_weights_from_group(1, [m.to_wire() for m in weight_metadata(new.items())]), loop
    )
    sender.broadcast(new)
    received.result(300)
    prompt = [1, 17, 4021, 88, 913, 2049, 31, 7]
    got = run(gen.prompt_logprobs(prompt))
    model.load_state_dict(new)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    want = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3
    sender.close()
    run(gen.close())
