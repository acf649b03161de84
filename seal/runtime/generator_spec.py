"""The generator group's settings, read before anything starts: the replica count, the async
engine's own settings, and the blocking engine a single process uses for evaluation.

An engine is recognised by what it is, not by its class path: a user's subclass of the async
engine is an async engine (``is_async_engine``).
"""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import OmegaConf

from actors.generation.async_vllm_engine import UPDATE_MODES, AsyncVllmGenerator
from seal.config import instantiate_spec, target_of


@functools.lru_cache(maxsize=64)
def is_async_engine(target: str | None) -> bool:
    """Whether the class ``target`` (a ``_target_`` path) is the async engine or a subclass of it."""
    if not target:
        return False
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception as exc:  # hydra raises ImportError or ValueError, by what is missing
        raise ValueError(f"generator._target_ {target!r} does not name a class: {exc}") from exc
    return isinstance(cls, type) and issubclass(cls, AsyncVllmGenerator)


def split_generator_spec(spec: dict) -> tuple[dict, int]:
    """The engine's constructor arguments and the replica count (a fleet setting, not the engine's)."""
    spec = dict(spec)
    if "replicas" not in spec:
        raise ValueError("generator.replicas is not set (each option of configs/generator/ sets it)")
    replicas = spec.pop("replicas")
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"generator.replicas must be an integer >= 1, got {replicas!r}")
    return spec, replicas


def check_fleet_spec(spec: dict) -> dict:
    """The fleet's settings checked before anything starts (the typed group, seal/config.py
    GeneratorConfig, has checked its own: update_timeout_s > 0 among them); returns the engine's
    arguments. An update mode left out is the engine's own."""
    spec, _ = split_generator_spec(spec)
    if is_async_engine(target_of(spec, "generator")):
        if "update_mode" in spec and spec["update_mode"] not in UPDATE_MODES:
            mode = spec["update_mode"]
            raise ValueError(f"generator.update_mode must be one of {', '.join(UPDATE_MODES)}, got {mode!r}")
    elif "update_mode" in spec:
        raise ValueError(
            "generator.update_mode needs the async engine (generator=vllm_async_cpu or vllm_async_gpu): "
            "the blocking engine always finishes a batch before its weights change"
        )
    return spec


ASYNC_ONLY_KEYS = ("update_mode", "update_timeout_s", "drain_timeout_s", "max_num_seqs")


def local_generator(node, **overrides) -> Any:
    """A generator for this process alone (`seal rollout`, `seal eval`, `seal evaluate`, the closing
    evaluation of `seal train`): one engine with blocking calls (local_generator_spec)."""
    return instantiate_spec(local_generator_spec(node, **overrides))


def local_generator_spec(node, **overrides) -> dict[str, Any]:
    """An async-engine config maps to the blocking engine with the same model, dtype and cache
    settings (greedy evaluation batches gain nothing from continuous batching); the fleet's
    replica count does not apply."""
    merged = OmegaConf.to_container(OmegaConf.merge(node, overrides), resolve=True)
    assert isinstance(merged, dict), node  # the generator group: a mapping
    spec, _ = split_generator_spec(merged)
    if is_async_engine(target_of(spec, "generator")):
        spec = {k: v for k, v in spec.items() if k not in ASYNC_ONLY_KEYS}
        spec["_target_"] = "actors.generation.vllm_engine.VllmGenerator"
    return spec
