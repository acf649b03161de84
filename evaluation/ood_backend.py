"""Our generator behind the OpenAI-compatible server: OpenAI messages in, our
model's raw text out.

A request's messages and tools are rendered the way our policy is trained to
read them (the Hermes/Qwen tool format of env_pool/bfcl/prompts.py): the tool
docs go into the system message inside <tools></tools>, earlier assistant
tool calls become ``<tool_call>{json}</tool_call>`` blocks, tool results stay
"tool" messages. The chat template and tokenisation are rollout/chat.py's, so
the model sees what it sees in training. The server (openai_server.py) turns
the reply's blocks back into OpenAI tool calls.

The same callable serves tau2's agent and its user simulator: the user
simulator's requests are ordinary chat requests (its own tools, in telecom).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from env_pool.bfcl.prompts import HERMES_TOOLS, tool_docs_text
from env_pool.ood.openai_server import PromptTooLong, Reply
from env_pool.tool_calls import ToolCall, render_calls
from rollout.chat import ChatTokenizer
from rollout.generator import GenerationRequest, Generator, SamplingConfig


class ContextOverflow(PromptTooLong):
    """The conversation no longer fits the model: the endpoint answers as
    OpenAI does (context_length_exceeded) and the tau2 episode ends with the
    named outcome context_overflow, not a crash."""


def render_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[dict[str, str]]:
    """OpenAI chat messages (and tools) as role/content messages in our format."""
    out: list[dict[str, str]] = []
    docs = [t["function"] if "function" in t else t for t in (tools or [])]
    block = HERMES_TOOLS.format(tools=tool_docs_text(docs, "json", None)) if docs else ""
    for m in messages:
        role, content = m.get("role"), _text(m.get("content"))
        if role == "assistant":
            calls = [_tool_call(c) for c in (m.get("tool_calls") or [])]
            text = "\n".join(p for p in (content, render_calls(calls, "json") if calls else "") if p)
            out.append({"role": "assistant", "content": text})
        elif role in ("system", "developer"):
            out.append({"role": "system", "content": content})
        elif role == "tool":
            out.append({"role": "tool", "content": content})
        else:
            out.append({"role": "user", "content": content})
    if block:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"].rstrip("\n") + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _tool_call(call: dict[str, Any]) -> ToolCall:
    fn = call.get("function") or {}
    args = fn.get("arguments") or "{}"
    try:
        parsed = json.loads(args) if isinstance(args, str) else dict(args)
    except ValueError:
        parsed = {}
    return ToolCall(str(fn.get("name", "")), parsed if isinstance(parsed, dict) else {})


class GeneratorChat:
    """``generate(messages, tools, temperature, max_tokens)`` over a Generator.

    ``max_new_tokens`` caps a reply when the request gives no max_tokens.
    Calls are serialised by the server, so one request at a time reaches the
    engine."""

    def __init__(self, generator: Generator, sampling: SamplingConfig | None = None, seed: int | None = None) -> None:
        self.generator = generator
        self.chat = ChatTokenizer(generator.tokenizer)
        self.sampling = sampling or SamplingConfig(temperature=0.0, max_new_tokens=256)
        self.seed = seed
        self._ids = itertools.count()

    def __call__(
        self, messages: list[dict], tools: list[dict] | None, temperature: float, max_tokens: int | None
    ) -> Reply:
        prompt = self.chat.prompt_ids(render_messages(messages, tools))
        budget = int(max_tokens) if max_tokens else self.sampling.max_new_tokens
        room = self.generator.max_model_len - len(prompt)
        if room < 1:
            raise ContextOverflow(
                f"context overflow: the prompt is {len(prompt)} tokens, the model holds {self.generator.max_model_len}"
            )
        sampling = SamplingConfig(
            temperature=max(0.0, float(temperature)),
            top_p=self.sampling.top_p,
            max_new_tokens=min(budget, room),
            seed=self.seed,
        )
        request = GenerationRequest(f"ood-{next(self._ids)}", prompt, sampling.max_new_tokens, self.seed)
        (out,) = self.generator.generate([request], sampling)
        text = self.chat.completion(out.token_ids).text
        finish = "length" if out.finish_reason == "length" else "stop"
        return Reply(text, out.prompt_tokens, len(out.token_ids), finish)


def tool_agent(generate: Any, temperature: float = 0.0, max_tokens: int | None = None) -> Any:
    """An agent ``(messages, tool docs) -> text`` over a generate callable
    (e.g. GeneratorChat), for harnesses that drive the model directly, without
    HTTP (the BFCL memory harness). Tool docs are BFCL function docs."""

    def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        reply = generate(messages, [{"type": "function", "function": t} for t in tools], temperature, max_tokens)
        return reply.text if isinstance(reply, Reply) else str(reply)

    return agent
