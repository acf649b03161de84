"""The conversation builder as the model group configures it (model.family, model.chat_template_kwargs)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf


def chat_options(cfg: Any) -> dict[str, Any]:
    """ChatTokenizer's settings from the typed model group: plain values, so they travel to Ray actors."""
    from seal.config import ModelConfig

    model = ModelConfig.of(cfg)
    return {"family": model.family or None, "template_kwargs": dict(model.chat_template_kwargs or {})}


def chat_tokenizer(cfg: Any, tokenizer: Any = None) -> Any:
    """The run's ChatTokenizer over ``tokenizer`` (default: the model's, loaded alone)."""
    from rollout.chat import ChatTokenizer
    from weights.model_assets import load_tokenizer

    return ChatTokenizer(
        tokenizer if tokenizer is not None else load_tokenizer(str(cfg.model.path)), **chat_options(cfg)
    )


def model_tool_format(path: str, family: str | None = None) -> str:
    """``${model_tool_format:${model.path},${model.family}}``: the tool-call format the model was
    trained with (its family's), which an env config can take instead of naming one."""
    from families.registry import tool_format_of
    from weights.model_assets import resolve_model

    return tool_format_of(resolve_model(str(path)), family or None)


def model_tools_block(path: str, family: str | None = None, tool_format: str | None = None) -> bool:
    """``${model_tools_block:${model.path},${model.family},${.tool_format}}``: whether the model's chat
    template has a tools block of its own for calls in ``tool_format``, which an env can hand its
    tools to on the training interface."""
    from families.registry import tools_block_of
    from weights.model_assets import resolve_model

    return tools_block_of(resolve_model(str(path)), family or None, tool_format or None)


def register_resolvers() -> None:
    for name, resolver in (("model_tool_format", model_tool_format), ("model_tools_block", model_tools_block)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=True)
