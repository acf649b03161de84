"""LoRA serving settings and adapter requests (actors/generation/adapters.py); the engine loading
and serving adapters runs in tests/integration/test_lora_generation.py."""

from __future__ import annotations

import pytest

from actors.generation.adapters import adapter_request
from actors.generation.engine_settings import EngineSettings, engine_setup


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def test_lora_serving_adds_vllms_lora_keywords_only_when_asked(model_dir):
    plain = engine_setup(EngineSettings(model_dir)).kwargs
    assert not {"enable_lora", "max_lora_rank", "max_loras"} & set(plain)
    lora = engine_setup(EngineSettings(model_dir, max_lora_rank=16, max_loras=3)).kwargs
    assert {k: lora[k] for k in ("enable_lora", "max_lora_rank", "max_loras")} == {
        "enable_lora": True,
        "max_lora_rank": 16,
        "max_loras": 3,
    }
    assert {k: v for k, v in lora.items() if k not in ("enable_lora", "max_lora_rank", "max_loras")} == plain


@pytest.mark.parametrize(
    "kwargs, message", [({"max_lora_rank": 12}, "one of vLLM's"), ({"max_lora_rank": 8, "max_loras": 0}, ">= 1")]
)
def test_lora_slots_vllm_would_refuse_are_refused_first(model_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings(model_dir, **kwargs)


def test_an_adapter_request_names_the_version_and_needs_peft_s_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json, adapter_model.safetensors"):
        adapter_request(3, tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    request = adapter_request(0, tmp_path)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == ("policy-v0", 1, str(tmp_path))
