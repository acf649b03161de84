"""The CUDA generator path (vLLM CUDA build): runs wherever CUDA and vLLM are installed."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def test_cuda_generator_generates_and_swaps_weights():
    pytest.importorskip("vllm")
    from actors.chat import ChatTokenizer
    from actors.generator import GenerationRequest, SamplingConfig
    from actors.model_assets import prepare_tiny_model
    from actors.vllm_generator import VllmGenerator

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
