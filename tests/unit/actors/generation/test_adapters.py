"""LoRA serving settings and adapter requests (actors/generation/adapters.py); the engine loading
and serving adapters runs in tests/integration/test_lora_generation.py."""

from __future__ import annotations

import pytest

from actors.generation.adapters import adapter_request
from actors.generation.engine_settings import EngineSettings, engine_setup


@pytest.fixture
def model_dir(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text("{}")
    layers = ("model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "lm_head")
    save_file({f"{name}.weight": torch.zeros(2, 2) for name in layers}, str(tmp_path / "model.safetensors"))
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
    # the adapter's layers, never the output head (weights/layer_names.py)
    assert lora["lora_target_modules"] == ["down_proj", "q_proj"]
    added = ("enable_lora", "max_lora_rank", "max_loras", "lora_target_modules")
    assert {k: v for k, v in lora.items() if k not in added} == plain


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


def _adapter(rank: int = 4) -> dict:
    import torch

    return {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(rank, 16),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(32, rank),
        "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight": torch.randn(rank, 64),
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight": torch.randn(16, rank),
    }


def test_adapter_files_written_from_tensors_read_back_equal_with_scaling_one(tmp_path):
    """The wire carries B already scaled by alpha / rank, so the config written says alpha = rank."""
    import json

    import torch

    from actors.generation.adapters import ADAPTER_FILES, read_adapter_files, write_adapter_files

    tensors = _adapter(rank=4)
    path, nbytes = write_adapter_files(tmp_path / "v000001", tensors)
    assert sorted(p.name for p in path.iterdir()) == sorted(ADAPTER_FILES) and nbytes > 0
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 4, ["down_proj", "q_proj"])
    back = read_adapter_files(path)
    assert set(back) == set(tensors) and all(torch.equal(back[n], t) for n, t in tensors.items())
    assert not (tmp_path / "v000001.tmp").exists()
    adapter_request(0, path)  # what the engine loads: peft's two files are there


def test_tensors_that_are_not_one_adapter_are_refused(tmp_path):
    import torch

    from actors.generation.adapters import adapter_config

    mixed = {**_adapter(rank=4), "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight": torch.randn(8, 16)}
    with pytest.raises(ValueError, match=r"one rank, found ranks \[4, 8\]"):
        adapter_config(mixed)
    with pytest.raises(ValueError, match="not adapter tensors"):
        adapter_config({**_adapter(), "model.embed_tokens.weight": torch.randn(4, 4)})


@pytest.mark.parametrize(
    "adapter_rank, expected",
    [
        (None, None),  # the learner publishes whole weights (no adapter, or publish: merged)
        (4, 8),  # vLLM's smallest rank holding 4
        (16, 16),
    ],
)
def test_a_learner_publishing_adapters_has_the_replicas_serve_them(adapter_rank, expected):
    from actors.generation.adapters import adapter_serving_spec

    spec = adapter_serving_spec({"model_path": "m"}, adapter_rank, None, async_engine=True)
    assert spec.get("max_lora_rank") == expected and spec["model_path"] == "m"


def test_adapter_serving_refuses_what_cannot_serve_the_adapter():
    from actors.generation.adapters import adapter_serving_spec

    with pytest.raises(ValueError, match="lora.publish=merged"):
        adapter_serving_spec({}, 16, None, async_engine=False)
    with pytest.raises(ValueError, match="max_lora_rank=8 cannot serve"):
        adapter_serving_spec({"max_lora_rank": 8}, 16, 8, async_engine=True)
    assert adapter_serving_spec({"max_lora_rank": 32}, 16, 32, async_engine=True)["max_lora_rank"] == 32
