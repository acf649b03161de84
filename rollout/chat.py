"""Token-exact conversation building for multi-turn rollouts, for every model family.

The policy is conditioned on token ids we own: the first prompt is the chat
template's rendering of the opening messages; after each generation the model's
own token ids are kept verbatim (loss mask 1, behaviour logprobs), and the
environment's reply is appended as the template's rendering of the new messages
(loss mask 0). Re-tokenising the whole conversation each step would change
earlier tokens at boundaries and break the match between what was sampled and
what the learner scores.

Each continuation is rendered on its own, after a fixed marker conversation
(a user turn, then an assistant turn whose text is a marker): what the template
writes after the marker is the assistant turn's close, the new messages and the
next generation prompt. Nothing depends on the template re-rendering history as
a growing prefix, so templates that rewrite earlier turns (Qwen3 drops the
reasoning of turns before the last user query), trim text (Llama 3.x, Gemma 3)
or demand strict alternation (Gemma 3) all build token-exactly.

What the policy sees of its own earlier reasoning: all of it, verbatim. The
tokens it sampled stay in its context for the rest of the episode (the trained
context is the sampled context), where an inference server that re-renders
history through the template would drop reasoning before the last user query.
The cost is context length; the gain is that no token the learner scores was
conditioned on a context the sampler did not see. docs/models.md says more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from families.registry import Family, detect_family, end_token_ids, family_named
from rollout.harmony_chat import HarmonyRenderer

Message = dict[str, Any]

MARK_USER = "SEAL marker question"
MARK_ASSISTANT = "SEAL marker answer"


class ChatBuildError(ValueError):
    """The model's chat template cannot build a turn of this conversation (names the model)."""


@dataclass(frozen=True)
class Completion:
    text: str  # what the environment reads: no end token, no reasoning
    reasoning: str  # the family's reasoning text of the turn ("" if none)
    ended: bool  # the model emitted one of the family's end tokens itself


@dataclass
class ChatTokenizer:
    tokenizer: Any  # a transformers tokenizer with a chat template
    family: Family | str | None = None  # a Family or its name (model.family); None: detected from the model
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # model.chat_template_kwargs
    model_dir: str | None = None  # None: the tokenizer's own directory

    def __post_init__(self) -> None:
        self.model_dir = self.model_dir or getattr(self.tokenizer, "name_or_path", None) or None
        self.name = str(self.model_dir or type(self.tokenizer).__name__)
        try:
            if isinstance(self.family, str):
                family = family_named(self.family)
            else:
                family = self.family or detect_family(self.tokenizer, self.model_dir)
        except ValueError as exc:
            raise ChatBuildError(str(exc)) from None
        self.family = family
        self.kwargs = {**family.template_kwargs, **self.template_kwargs}
        self.harmony = None
        if family.renderer == "harmony":
            try:
                self.harmony = HarmonyRenderer(self.tokenizer, self.kwargs)
            except ValueError as exc:
                raise ChatBuildError(f"{self.name} (family {family.name}): {exc}") from None
        self.end_ids = end_token_ids(self.tokenizer, family, self.model_dir)
        if not self.end_ids:
            raise ChatBuildError(f"{self.name}: no end-of-turn token (no EOS, no generation_config eos_token_id)")
        self.end_texts = tuple(self.tokenizer.decode([i], skip_special_tokens=False) for i in self.end_ids)
        self.eos_id = self.end_ids[0]  # the token a scripted turn ends with

    @property
    def fam(self) -> Family:
        assert isinstance(self.family, Family)  # set in __post_init__
        return self.family

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        if self.harmony is not None:
            ids = self.prompt_ids(messages)
            ids = ids if generation_prompt else ids[: len(ids) - len(self.harmony.generation_prompt())]
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        # An env that hands its tools to the template's own tools block puts them on a message.
        tools = next((m["tools"] for m in messages if m.get("tools")), None)
        try:
            return self.tokenizer.apply_chat_template(
                self.fam.template_messages(messages),
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **({"tools": tools} if tools else {}),
                **self.kwargs,
            )
        except Exception as exc:  # jinja's TemplateError and the template's own raise_exception
            raise ChatBuildError(
                f"{self.name} (family {self.fam.name}): the chat template refused the conversation: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        if self.harmony is not None:
            return self._harmony_call(lambda h: h.prompt_ids(messages))
        return self.encode(self.render(messages, generation_prompt=True))

    def _harmony_call(self, call: Any) -> list[int]:
        try:
            return list(call(self.harmony))
        except Exception as exc:  # openai-harmony's own errors: a message it cannot render
            raise ChatBuildError(
                f"{self.name} (family {self.fam.name}): harmony: {type(exc).__name__}: {exc}"
            ) from None

    def completion(self, gen_ids: Sequence[int]) -> Completion:
        """One generated turn as the environment reads it: the end token, whichever of the
        family's the model emitted, is not part of the text; neither is its reasoning."""
        ended = bool(gen_ids) and gen_ids[-1] in self.end_ids
        body = list(gen_ids[:-1]) if ended else list(gen_ids)
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        if self.harmony is not None:  # harmony's parser wants the turn's own end token
            reasoning, content = self.harmony.split(list(gen_ids), text)
            return Completion(content, reasoning, ended)
        reasoning, content = self.fam.split_reasoning(text)
        return Completion(content, reasoning, ended)

    def continuation_ids(self, ended: bool, new_messages: Sequence[Message]) -> list[int]:
        """Tokens that follow a generated turn: the close of the assistant message (unless the
        model emitted an end token itself), the env's messages, and the next generation
        prompt (none when ``new_messages`` is empty: the episode's end)."""
        if self.harmony is not None:
            return self._harmony_call(lambda h: h.continuation_ids(ended, new_messages))
        marker: list[Message] = [
            {"role": "user", "content": MARK_USER},
            {"role": "assistant", "content": MARK_ASSISTANT},
        ]
        full = self.render(marker + list(new_messages), generation_prompt=bool(new_messages))
        at = full.rfind(MARK_ASSISTANT)
        if at < 0 or full.count(MARK_ASSISTANT) != 1:
            raise ChatBuildError(
                f"{self.name} (family {self.fam.name}): the chat template does not render an assistant "
                "turn's text verbatim, so a turn's continuation cannot be built"
            )
        rest = full[at + len(MARK_ASSISTANT) :]
        if ended:
            for end in self.end_texts:
                if end and rest.startswith(end):
                    rest = rest[len(end) :]
                    break
        return self.encode(rest)
