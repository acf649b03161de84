"""The generator interface rollouts use, whatever engine is behind it."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# One span type from the engine to the trajectory: an output's spans are its trajectory's
# segments shifted by where the turn starts (rollout/play.py), on the wire unchanged.
from replay.messages import Segment

if TYPE_CHECKING:
    from weights.buckets import WeightManifest


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # training 1.0; evaluation 0 (greedy)
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: Sequence[int]
    max_new_tokens: int
    seed: int | None = None  # per-request seed (reproducible groups)
    # trainer.episode_version=pinned: the episode this request belongs to, served on the one policy
    # version its first request ran on (actors/generation/episode_pins.py); ``pin_version`` that
    # version once the episode has it from its first output (None before). None: the newest.
    episode_id: str | None = None
    pin_version: int | None = None


@dataclass(frozen=True)
class GenerationOutput:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the behaviour policy
    finish_reason: str  # stop | length | abort
    policy_version: int  # the oldest weights that produced a token of this output (staleness counts from it)
    prompt_tokens: int
    cached_prompt_tokens: int  # prefix-cache hits
    # An output generated across a weight update (update_mode keep or abort) has
    # several; empty: every token was made by ``policy_version``.
    spans: tuple[Segment, ...] = ()

    def version_spans(self) -> tuple[Segment, ...]:
        """Contiguous spans covering every output token: one when the weights never
        changed (an empty one for an empty output, so each turn keeps a segment)."""
        return self.spans or (Segment(0, len(self.token_ids), self.policy_version),)


class GeneratorUnavailable(RuntimeError):
    """The generator process is gone or restarting: the episode cannot go on
    and must be re-issued, not recorded as a failure of the policy."""


class Generator(abc.ABC):
    """Samples completions with per-token logprobs; weights swap in place, versioned."""

    policy_version: int = 0
    max_model_len: int

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any: ...

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[GenerationOutput]:
        """Complete every request. Weight updates never interleave with a call:
        each output was produced by one version, stamped on it."""

    @abc.abstractmethod
    def update_weights(self, version: int, source: str | Mapping[str, Any] | WeightManifest) -> float:
        """Load new weights without restarting: a safetensors directory, a WeightManifest
        (the learner's buckets in Ray's object store, loaded one at a time) or, for callers in
        the same process, a name -> tensor mapping; returns seconds taken. Later outputs carry
        ``version``."""

    def reference_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-prob of each token after the first of every sequence under the base model, no adapter
        (trainer.reference_logprobs=generator: under LoRA the base is the KL reference). Only an engine
        serving LoRA adapters has a base apart from the policy; the others refuse."""
        raise NotImplementedError(
            f"{type(self).__name__} serves no base model apart from the policy: trainer.reference_logprobs=generator "
            "needs a vLLM replica serving LoRA adapters"
        )

    def end_episodes(self, episode_ids: Sequence[str]) -> None:  # noqa: B027 - optional
        """Pinned episodes are over: the versions they held may go (an engine without pins holds none)."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
