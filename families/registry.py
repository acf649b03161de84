"""The families SEAL knows, how a model is matched to one, and the family's end-token set.

A family is data, not code paths: the conversation builder (rollout/chat.py), the
tool-call parser (env_pool/tool_calls.py) and the engines (actors/generation) read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = Mapping[str, Any]

# How a tool result is shown to a template without a tool role (Gemma 3: Google's documented
# prompt-defined tool use wraps results in a tool_output block inside the user turn).
TOOL_OUTPUT_BLOCK = "```tool_output\n{content}\n```"


@dataclass(frozen=True)
class Family:
    name: str
    tool_format: str  # the calls the model was trained to write; an env's `tool_format: auto` takes it
    end_texts: tuple[str, ...]  # tokens that end an assistant turn, besides the tokenizer's EOS and generation_config's
    reasoning: tuple[str, str] | None = None  # (open, close) of reasoning text; the env only sees what follows close
    # "roles": env replies keep their roles; "user_turn": every env message between two model turns is
    # folded into one user message (templates with strict user/model alternation and no tool role).
    env_messages: str = "roles"
    json_tool_results: bool = False  # the template JSON-dumps tool content: give it parsed JSON, not a string
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # fixed for a deterministic render
    # "template": the tokenizer's chat template renders; "harmony": openai-harmony does (gpt-oss ships
    # no template; its reasoning is the analysis channel, rollout/harmony_chat.py)
    renderer: str = "template"
    # The template (or harmony) has a tools block of its own: on the training interface an env may hand
    # its tools to it (``tools=``) instead of writing them into its system prompt.
    tools_block: bool = False
    summary: str = ""

    def template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Messages as this family's chat template takes them (role + content, adapted)."""
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        if self.env_messages == "user_turn":
            return _fold_env_turns(plain)
        if self.json_tool_results:
            return [{**m, "content": _as_json(m["content"])} if m["role"] == "tool" else m for m in plain]
        return plain

    def split_reasoning(self, text: str) -> tuple[str, str]:
        """(reasoning, visible content) of one generated turn. A turn cut inside its reasoning
        has no visible content: nothing in it may reach the env as a message or a call."""
        if self.reasoning is None:
            return "", text
        open_, close = self.reasoning
        if close in text:
            head, _, content = text.partition(close)
            return head.split(open_, 1)[-1], content.lstrip("\n")
        if open_ in text:
            before, _, reasoning = text.partition(open_)
            return reasoning, before
        return "", text


def _as_json(content: Any) -> Any:
    if isinstance(content, str) and content[:1] in "{[":
        try:
            return json.loads(content)
        except ValueError:
            pass
    return content


def _fold_env_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        text = TOOL_OUTPUT_BLOCK.format(content=m["content"]) if role == "tool" else m["content"]
        if role in ("system", "assistant"):
            out.append({"role": role, "content": text})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": "user", "content": text})
    return out


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "chatml",
            tool_format="json",
            end_texts=("<|im_end|>",),
            summary="ChatML without a tools block (SmolLM2: the embedded and tiny models); tools in SEAL's prompt",
        ),
        Family(
            "qwen2.5",
            tool_format="json",
            end_texts=("<|im_end|>", "<|endoftext|>"),
            tools_block=True,
            summary="ChatML, tools in <tools>, calls <tool_call> JSON, results in <tool_response>",
        ),
        Family(
            "qwen3",
            tool_format="json",
            end_texts=("<|im_end|>", "<|endoftext|>"),
            reasoning=("<think>", "</think>"),
            tools_block=True,
            summary="Qwen2.5's format plus <think> reasoning (enable_thinking)",
        ),
        Family(
            "llama3",
            tool_format="llama_json",
            end_texts=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
            json_tool_results=True,
            # The template prints today's date unless given one: a render must not change with the day.
            template_kwargs={"date_string": "26 Jul 2024"},
            tools_block=True,
            summary='Llama 3.1/3.2: calls as bare JSON {"name", "parameters"} or after <|python_tag|>; results as ipython',
        ),
        Family(
            "gemma3",
            tool_format="json",
            end_texts=("<end_of_turn>", "<eos>"),
            env_messages="user_turn",
            summary="strict user/model alternation, no tool role or tools block: tools in SEAL's prompt, results in the user turn",
        ),
        Family(
            "deepseek_v3",
            tool_format="deepseek",
            end_texts=("<｜end▁of▁sentence｜>",),
            summary="calls between <｜tool▁calls▁begin｜> special tokens, results in <｜tool▁outputs▁begin｜>",
        ),
        Family(
            "gpt-oss",
            tool_format="harmony",
            end_texts=("<|return|>", "<|call|>"),
            renderer="harmony",
            tools_block=True,
            summary="harmony: analysis/commentary/final channels, calls to=functions.NAME, ends <|return|>/<|call|>",
        ),
    )
}


class UnknownFamily(ValueError):
    """No family matches a model: the fix is naming one (model.family)."""


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise UnknownFamily(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def model_type(model_dir: str | Path | None) -> str | None:
    """config.json's model_type (a multimodal config's text part first), or None without one."""
    if model_dir is None:
        return None
    try:
        config_json = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config_json.get("text_config")
    return (text.get("model_type") if isinstance(text, dict) else None) or config_json.get("model_type")


def read_chat_template(model_dir: str | Path) -> str:
    """A model directory's chat template without loading its tokenizer: chat_template.jinja
    (what transformers 5 saves) or tokenizer_config.json's chat_template."""
    path = Path(model_dir)
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    try:
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return ""
    return _default_template(template)


def _default_template(template: Any) -> str:
    if isinstance(template, list):  # named templates: the default one decides
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) else ""


def detect_family(tokenizer: Any, model_dir: str | Path | None = None) -> Family:
    """The family of a model, from its config's model_type and its chat template's markers."""
    return family_of(_default_template(getattr(tokenizer, "chat_template", None)), model_type(model_dir), model_dir)


def family_of(template: str, kind: str | None, model_dir: str | Path | None = None) -> Family:
    """The family of a chat template (and config model_type, where the template alone cannot tell)."""
    kind = (kind or "").lower()
    if kind.startswith("gpt_oss") or "<|channel|>" in template:
        return FAMILIES["gpt-oss"]
    if kind.startswith("gemma") or "<start_of_turn>" in template:
        return FAMILIES["gemma3"]
    if kind.startswith("deepseek") or "<｜Assistant｜>" in template:
        return FAMILIES["deepseek_v3"]
    if "<|start_header_id|>" in template:
        return FAMILIES["llama3"]
    if "<|im_start|>" in template:
        if kind.startswith("qwen3") or "<think>" in template:
            return FAMILIES["qwen3"]
        if "<tool_call>" in template:
            return FAMILIES["qwen2.5"]
        return FAMILIES["chatml"]
    where = f" ({model_dir})" if model_dir else ""
    if not template:
        raise UnknownFamily(f"the tokenizer{where} has no chat template: SEAL builds conversations with it")
    raise UnknownFamily(
        f"cannot tell the model family{where} from model_type {kind or 'none'!r} and its chat template; "
        f"set model.family to one of {', '.join(FAMILIES)}"
    )


def tool_format_of(model_dir: str | Path, family: str | None = None) -> str:
    """The tool-call format a model was trained with: what an env's ``tool_format: auto`` means."""
    if family:
        return family_named(family).tool_format
    return family_of(read_chat_template(model_dir), model_type(model_dir), model_dir).tool_format


def tools_block_of(model_dir: str | Path, family: str | None = None, tool_format: str | None = None) -> bool:
    """Whether the model's template takes tools itself, for calls in ``tool_format``: what an env's
    ``tools_in_template`` follows. A template's tools block teaches its family's own call format, so
    an env told to use another format keeps its tools in its prompt."""
    fam = family_named(family) if family else family_of(read_chat_template(model_dir), model_type(model_dir), model_dir)
    return fam.tools_block and tool_format in (None, fam.tool_format)


def turn_end_ids(tokenizer: Any, model_dir: str | Path | None) -> tuple[int, ...]:
    """The end set an engine stops on: the family's when the model has a known family, else the
    tokenizer's EOS and generation_config's (an engine serves models SEAL cannot build chats for too)."""
    try:
        family = detect_family(tokenizer, model_dir)
    except UnknownFamily:
        family = Family("unknown", tool_format="json", end_texts=())
    return end_token_ids(tokenizer, family, model_dir)


def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when the tokenizer has it as one token, else None."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=False) == text:
        return int(ids[0])
    return None


def generation_config_end_ids(model_dir: str | Path | None) -> list[int]:
    if model_dir is None:
        return []
    try:
        gen = json.loads((Path(model_dir) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return []
    eos = gen.get("eos_token_id")
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]


def end_token_ids(tokenizer: Any, family: Family, model_dir: str | Path | None = None) -> tuple[int, ...]:
    """Every token that ends a turn: the tokenizer's EOS, generation_config's end ids and the
    family's own end tokens that this vocabulary has. The engines stop on all of them."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    ids += generation_config_end_ids(model_dir)
    ids += [i for t in family.end_texts if (i := single_token_id(tokenizer, t)) is not None]
    return tuple(dict.fromkeys(ids))
