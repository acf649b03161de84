"""The model group reaches the conversation builder (seal/chat_setup.py): every model option sets
model.family and model.chat_template_kwargs, and BFCL's tool format follows the model's family."""

from __future__ import annotations

from pathlib import Path

import pytest

from seal.chat_setup import chat_options
from seal.config import compose

MODELS = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "configs" / "model").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_option_gives_the_chat_settings(model):
    overrides = [f"model={model}"] + (["model.path=/models/any"] if model == "local" else [])
    assert chat_options(compose(overrides)) == {"family": None, "template_kwargs": {}}  # null: none


def test_settings_given_on_the_command_line_reach_the_builder():
    cfg = compose(["model.family=qwen3", "model.chat_template_kwargs={enable_thinking:false}"])
    assert chat_options(cfg) == {"family": "qwen3", "template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize(
    "model,fmt,block",
    [("embedded", "json", False), ("llama3.1-twin", "llama_json", True), ("gemma3-twin", "json", False)],
)
def test_bfcl_takes_the_model_familys_tool_format_and_tools_block_unless_told(model, fmt, block):
    env = compose(["env=bfcl", f"model={model}"]).env
    assert (env.tool_format, env.tools_in_template) == (fmt, block)
    env = compose(["env=bfcl", f"model={model}", "model.family=deepseek_v3"]).env
    assert (env.tool_format, env.tools_in_template) == ("deepseek", False)
    env = compose(["env=bfcl", f"model={model}", "env.tool_format=python"]).env
    assert (env.tool_format, env.tools_in_template) == ("python", False)  # a tools block teaches its own format
