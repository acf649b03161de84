"""gpt-oss conversations in the harmony format, rendered and parsed by openai-harmony.

gpt-oss ships no chat template for this: its conversations are harmony (a system message with the
reasoning effort, a developer message with the instructions, analysis/commentary/final channels,
tool calls on the commentary channel ``to=functions.NAME``, results from ``functions.NAME``).
openai-harmony renders them from the o200k_base vocabulary, which it otherwise downloads: SEAL
writes that file from the model's own tokenizer.json (byte-level BPE, the same ranks) and checks it
against OpenAI's published SHA-256 before use, so nothing is fetched at run time.

The same rules as every family (rollout/chat.py): the sampled tokens stay verbatim; each env reply
is rendered alone, message by message, with the next ``<|start|>assistant`` prompt after it.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from weights.cache import cache_root

# SHA-256 of https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken, the file
# openai-harmony checks a download against.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_BASE_TOKENS = 199998  # ranks of o200k_base; gpt-oss's special tokens come after them
CONVERSATION_DATE = "2024-07-26"  # fixed: a render must not change with the day
CALL_END, RETURN, MESSAGE_END = "<|call|>", "<|return|>", "<|end|>"


class HarmonyError(ValueError):
    """The harmony vocabulary or a conversation could not be built."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte-level BPE writes for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def o200k_base_file(vocab: Mapping[str, int], out_dir: Path) -> Path:
    """o200k_base.tiktoken written from a byte-level BPE vocabulary; refused unless it is OpenAI's file."""
    path = out_dir / "o200k_base.tiktoken"
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == O200K_BASE_SHA256:
        return path
    dec = _byte_decoder()
    try:
        ranked = sorted((i, t) for t, i in vocab.items() if i < O200K_BASE_TOKENS)
        data = "".join(f"{base64.b64encode(bytes(dec[c] for c in t)).decode()} {i}\n" for i, t in ranked).encode()
    except KeyError as exc:
        raise HarmonyError(f"the tokenizer is not a byte-level BPE (character {exc} has no byte)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise HarmonyError(f"the tokenizer's first {O200K_BASE_TOKENS} tokens are not o200k_base (sha256 {digest})")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


@lru_cache(maxsize=1)
def _encoding(vocab_dir: str) -> Any:
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = vocab_dir  # read by openai-harmony at load
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def harmony_encoding(tokenizer: Any) -> Any:
    vocab_dir = cache_root() / "harmony"
    o200k_base_file(tokenizer.get_vocab(), vocab_dir)
    return _encoding(str(vocab_dir))


class HarmonyRenderer:
    """The conversation builder's three operations for gpt-oss, in token ids."""

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any]) -> None:
        from openai_harmony import ReasoningEffort

        self.enc = harmony_encoding(tokenizer)
        effort = str(template_kwargs.get("reasoning_effort", "medium")).upper()
        if effort not in ReasoningEffort.__members__:
            raise HarmonyError(f"reasoning_effort must be low, medium or high, got {effort.lower()!r}")
        self.effort = ReasoningEffort[effort]
        self.date = str(template_kwargs.get("conversation_start_date", CONVERSATION_DATE))

    def _message(self, m: Mapping[str, Any]) -> Any:
        from openai_harmony import Author, DeveloperContent, Message, Role, ToolDescription

        role, text = m["role"], str(m["content"])
        if role == "system":
            developer = DeveloperContent.new().with_instructions(text)
            if m.get("tools"):  # the env's tools, for harmony's own `namespace functions` block
                developer = developer.with_function_tools(
                    [
                        ToolDescription.new(
                            t["function"]["name"],
                            t["function"].get("description", ""),
                            parameters=t["function"].get("parameters"),
                        )
                        for t in m["tools"]
                    ]
                )
            return Message.from_role_and_content(Role.DEVELOPER, developer)
        if role == "user":
            return Message.from_role_and_content(Role.USER, text)
        if role == "tool":
            author = Author.new(Role.TOOL, f"functions.{m.get('name') or 'tool'}")
            return Message.from_author_and_content(author, text).with_channel("commentary").with_recipient("assistant")
        raise HarmonyError(f"harmony renders no {role!r} message here")

    def _render(self, m: Mapping[str, Any]) -> list[int]:
        if m["role"] == "assistant":  # a worked example's turn: its text as the model writes it
            text = str(m["content"])
            body = text if text.startswith("<|channel|>") else f"<|channel|>final<|message|>{text}"
            close = "" if body.endswith(CALL_END) else MESSAGE_END
            return list(self.enc.encode(f"<|start|>assistant{body}{close}", allowed_special="all"))
        return list(self.enc.render(self._message(m)))

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        from openai_harmony import Message, Role, SystemContent

        system = SystemContent.new().with_reasoning_effort(self.effort).with_conversation_start_date(self.date)
        ids = list(self.enc.render(Message.from_role_and_content(Role.SYSTEM, system)))
        for m in messages:
            ids += self._render(m)
        return ids + self.generation_prompt()

    def generation_prompt(self) -> list[int]:
        return list(self.enc.encode("<|start|>assistant", allowed_special="all"))

    def continuation_ids(self, ended: bool, new_messages: Sequence[Mapping[str, Any]]) -> list[int]:
        ids = [] if ended else list(self.enc.encode(MESSAGE_END, allowed_special="all"))
        for m in new_messages:
            ids += self._render(m)
        return ids + (self.generation_prompt() if new_messages else [])

    def split(self, gen_ids: Sequence[int], raw: str) -> tuple[str, str]:
        """(reasoning, the env's text) of one generated turn: analysis is reasoning; a call is kept in
        its harmony form (the env's ``harmony`` tool format reads it); final text is the message.
        ``raw``: the turn's text without its end token, read when the turn is not valid harmony."""
        from openai_harmony import Role

        try:
            messages = self.enc.parse_messages_from_completion_tokens(list(gen_ids), Role.ASSISTANT)
        except Exception:  # malformed harmony (a cut turn, a random model): the env reads the raw text,
            # less any analysis: a call drafted in reasoning is never acted on
            head, analysis, rest = raw.partition("<|channel|>analysis")
            if not analysis:
                return "", raw
            thought, closed, after = rest.partition(MESSAGE_END)
            return thought, (after if closed else head)
        reasoning: list[str] = []
        visible: list[str] = []
        for m in messages:
            text = "".join(getattr(c, "text", "") for c in m.content)
            if m.channel == "analysis":
                reasoning.append(text)
            elif m.recipient and m.recipient.startswith("functions."):
                visible.append(f"<|channel|>commentary to={m.recipient} <|constrain|>json<|message|>{text}{CALL_END}")
            else:
                visible.append(text)
        return "\n".join(reasoning), "\n".join(visible)
