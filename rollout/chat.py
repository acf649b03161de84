"""Token-exact conversation building for multi-turn rollouts.

The policy is conditioned on token ids we own: the first prompt is the chat
template's rendering of the opening messages; after each generation the model's
own token ids are kept verbatim (loss mask 1, behaviour logprobs), and the
environment's reply is appended as the template's rendering of the new
messages (loss mask 0). Re-tokenising the whole conversation each step would
change earlier tokens at boundaries and break the match between what was
sampled and what the learner scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


def template_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as a plain chat template takes them (role + content only)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@dataclass
class ChatTokenizer:
    tokenizer: Any  # a transformers tokenizer with a chat template

    def __post_init__(self) -> None:
        self.eos_id = self.tokenizer.eos_token_id
        self.eos_text = self.tokenizer.decode([self.eos_id]) if self.eos_id is not None else ""

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            template_messages(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.render(messages, generation_prompt=True))

    def completion_text(self, gen_ids: Sequence[int]) -> tuple[str, bool]:
        """(assistant message text, whether generation ended with EOS)."""
        ended = bool(gen_ids) and gen_ids[-1] == self.eos_id
        body = list(gen_ids[:-1]) if ended else list(gen_ids)
        return self.tokenizer.decode(body, skip_special_tokens=False), ended

    def continuation_ids(
        self, before: Sequence[Message], assistant_text: str, ended_with_eos: bool, new_messages: Sequence[Message]
    ) -> list[int]:
        """Tokens that follow the generated ones: end of the assistant message
        (unless the model emitted EOS itself), the env's messages, and the next
        generation prompt (none when ``new_messages`` is empty: episode end)."""
        start = self.render(before, generation_prompt=True) + assistant_text
        convo = list(before) + [{"role": "assistant", "content": assistant_text}] + list(new_messages)
        full = self.render(convo, generation_prompt=bool(new_messages))
        if not full.startswith(start):
            raise ValueError(
                "the chat template does not render conversations as growing prefixes; it cannot be used for multi-turn rollouts"
            )
        rest = full[len(start) :]
        if ended_with_eos and self.eos_text and rest.startswith(self.eos_text):
            rest = rest[len(self.eos_text) :]
        return self.encode(rest)
