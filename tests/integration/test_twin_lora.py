"""LoRA serving per architecture: a rank-8 adapter on each training twin, served by vLLM beside the
base (actors/generation/adapters.py), scores fixed tokens as the learner scores them. vLLM names its
layers otherwise than transformers (stacked qkv and gate_up projections, biases, tied heads, q/k
norms, MoE routers), and the engine wraps only the model's linear layers (weights/layer_names.py):
an adapter tensor it did not place would leave the base served, a layer it cannot wrap would stop
the engine at start.

The adapter's B matrices are set to seeded noise (peft starts them at zero: a no-op adapter would pass
unseen). Tolerance as for whole weights (tests/integration/test_twin_weight_sync.py): 1e-4 on a
log-prob in fp32; an adapter that did not land misses by its effect, asserted above 1e-2.
qwen3-twin runs by default; the other twins are marked slow.
"""

from __future__ import annotations

import pytest

from tests.integration.test_twin_weight_sync import CHEAP, TOLERANCE, fixed_sequences, max_diff
from weights.twins import TWIN_NAMES, max_model_len

NOISE = 0.05  # std of each lora_B entry


def lora_learner_for(model: str):
    from learner.config import LearnerConfig
    from learner.engine import Learner
    from learner.lora import LoraConfig

    cfg = LearnerConfig(backend="torch", mini_batch_groups=1, micro_batch_size=1, lora=LoraConfig(rank=8, alpha=16))
    return Learner(model, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == CHEAP else pytest.mark.slow) for n in TWIN_NAMES])
def test_vllm_serves_each_twins_adapter_as_the_learner_scores_it(name, tmp_path):
    import torch

    from actors.generation.vllm_engine import VllmGenerator
    from learner.lora import write_adapter

    generator = VllmGenerator(name, max_model_len=min(1024, max_model_len(name)), cpu_kv_cache_gb=1, max_lora_rank=8)
    try:
        learner = lora_learner_for(name)
        assert generator.dtype == "float32"
        seqs = fixed_sequences(generator.tokenizer, learner.model.config.vocab_size)
        base = [generator.prompt_logprobs(s) for s in seqs]
        with torch.no_grad():
            with learner.model.disable_adapter():
                assert max_diff(base, [learner.canary_logprobs(s) for s in seqs]) <= TOLERANCE
            noise = torch.Generator().manual_seed(1)
            for pname, p in learner.model.named_parameters():
                if "lora_B" in pname:
                    p.copy_(NOISE * torch.randn(p.shape, generator=noise))
        directory, _ = write_adapter(learner.model, tmp_path / "v1")
        generator.load_adapter(1, str(directory))
        served = [generator.prompt_logprobs(s) for s in seqs]
        assert max_diff(served, [learner.canary_logprobs(s) for s in seqs]) <= TOLERANCE, name
        assert max_diff(served, base) > 1e-2, f"{name}: the adapter changed nothing"
        # trainer.reference_logprobs=generator: with the adapter loaded, the base still scores the reference
        assert max_diff(generator.reference_logprobs(seqs), base) <= TOLERANCE, name
    finally:
        generator.close()
