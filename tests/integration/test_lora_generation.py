"""Publishing a LoRA adapter to vLLM: the blocking engine serves the base once and each policy
version as an adapter; after a publish its log-probabilities on fixed tokens equal the learner's.

Tolerance (fp32 on both sides): 1e-4 nats per token. Measured on AMD EPYC (2 threads) the largest
gap over these tokens is 0 with the adapter and 1e-6 without it (vLLM's CPU attention and matmuls
sum in another order than torch's); fp32 rounding of ~11-nat log-probs through two 64-wide layers
stays below 1e-5. The adapter moves them by about 0.1 here, so a publish that did not land (the
base or an older version served) fails by three orders of magnitude more than the bound.
"""

from __future__ import annotations

import pytest
import torch

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.lora import write_adapter
from rollout.generator import GenerationRequest, SamplingConfig
from tests.integration.test_learner_engine import make_batch
from tests.integration.test_learner_lora import lora_learner

TOLERANCE = 1e-4
TOKENS = [1, 900, 47, 3000, 12, 801, 77, 4000, 23, 555, 4321, 9, 1200]


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


@pytest.fixture(scope="module")
def generator(tiny_path):
    from actors.generation.vllm_engine import VllmGenerator

    gen = VllmGenerator(tiny_path, max_model_len=512, cpu_kv_cache_gb=0.25, dtype="float32", max_lora_rank=8)
    yield gen
    gen.close()


def gap(a, b) -> float:
    assert len(a) == len(b) == len(TOKENS) - 1
    return max(abs(x - y) for x, y in zip(a, b))


def learner_base_logprobs(lrn):
    with torch.no_grad(), lrn.model.disable_adapter():
        return lrn.canary_logprobs(TOKENS)


def test_published_adapters_give_the_learners_logprobs(tiny_path, generator, tmp_path):
    lrn = lora_learner(tiny_path)
    base = learner_base_logprobs(lrn)
    assert generator.adapters.current is None
    assert gap(generator.prompt_logprobs(TOKENS), base) <= TOLERANCE  # the base, before any adapter

    engine = generator._llm.llm_engine
    for version in (1, 2, 3):
        lrn.train_batch(make_batch(version, tiny_path), RELEASED_BASE_WEIGHTS)
        directory, nbytes = write_adapter(lrn.model, tmp_path / f"v{version}")
        full = sum(p.numel() * 4 for p in lrn.model.parameters() if not p.requires_grad)  # the base, fp32
        assert nbytes < full / 5, (nbytes, full)
        seconds = generator.load_adapter(version, str(directory))
        assert seconds >= 0 and generator.policy_version == version
        assert generator.adapters.current.lora_int_id == version + 1
        served, learned = generator.prompt_logprobs(TOKENS), lrn.canary_logprobs(TOKENS)
        assert gap(served, learned) <= TOLERANCE, f"v{version}: vLLM's adapter gives other log-probs"
        assert gap(served, base) > 100 * TOLERANCE, f"v{version}: the adapter changed nothing"
        assert engine.list_loras() == set(range(max(2, version), version + 2))  # the newest two (max_loras)

    out = generator.generate(
        [GenerationRequest(request_id="r", prompt_ids=TOKENS, max_new_tokens=4)], SamplingConfig(temperature=0.0)
    )[0]
    assert out.policy_version == 3 and len(out.token_ids) == len(out.logprobs) > 0
    # trainer.reference_logprobs=generator: with an adapter loaded, the base still answers the reference
    (reference,) = generator.reference_logprobs([TOKENS])
    assert gap(reference, base) <= TOLERANCE and gap(reference, served) > 100 * TOLERANCE


def test_a_publish_is_refused_for_an_older_version_or_a_missing_adapter(generator, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        generator.load_adapter(generator.policy_version + 1, str(tmp_path))
    with pytest.raises(ValueError, match="older than"):
        generator.load_adapter(generator.policy_version - 1, str(tmp_path))
