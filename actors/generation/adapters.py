"""Policy versions as LoRA adapters on a vLLM engine that serves the base model once.

With ``max_lora_rank`` > 0 an engine starts with vLLM's LoRA serving (``enable_lora``,
``max_lora_rank``, ``max_loras`` adapter slots: engine_settings.py). A publish is then the
learner's adapter directory (peft's adapter_config.json + adapter_model.safetensors, written by
learner/lora.py ``write_adapter``), megabytes where a full publish sends the model: the engine
loads it eagerly (``add_lora``: a file that does not load fails the publish, not a later request)
and every later request carries its ``LoRARequest``. Version v is adapter id v + 1 (vLLM's ids
start at 1). ``AdapterSlots`` keeps the newest ``keep`` versions loaded and removes older ones,
so a replica holds at most ``max_loras`` adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# vLLM's LoRAConfig.max_lora_rank accepts exactly these (vllm/config/lora.py MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_lora_slots(max_lora_rank: int, max_loras: int) -> None:
    """Refuse, in one line, what vLLM would refuse when the engine starts (0: no LoRA serving)."""
    if max_lora_rank and max_lora_rank not in VLLM_LORA_RANKS:
        raise ValueError(
            f"max_lora_rank must be 0 (no adapters) or one of vLLM's {VLLM_LORA_RANKS}, got {max_lora_rank}"
        )
    if max_loras < 1:
        raise ValueError(f"max_loras must be >= 1, got {max_loras}")


def lora_engine_args(max_lora_rank: int, max_loras: int) -> dict[str, Any]:
    """vLLM's engine keywords for LoRA serving; none when ``max_lora_rank`` is 0."""
    check_lora_slots(max_lora_rank, max_loras)
    if not max_lora_rank:
        return {}
    return {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": max_loras}


def adapter_request(version: int, directory: str | Path) -> Any:
    """The LoRARequest of policy ``version``, whose adapter lies in ``directory``."""
    from vllm.lora.request import LoRARequest

    path = Path(directory)
    missing = [name for name in ADAPTER_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"adapter for v{version} in {path} lacks {', '.join(missing)}")
    return LoRARequest(lora_name=f"policy-v{version}", lora_int_id=version + 1, lora_path=str(path))


class AdapterSlots:
    """The adapters one engine holds: ``load`` adds a version, the newest is what requests use."""

    def __init__(self, engine: Any, keep: int) -> None:
        self._engine = engine  # vLLM's LLMEngine (or anything with add_lora / remove_lora)
        self._keep = max(1, keep)
        self._loaded: list[Any] = []  # oldest first

    @property
    def current(self) -> Any:
        """The newest version's LoRARequest; None before the first adapter (the base model serves)."""
        return self._loaded[-1] if self._loaded else None

    def load(self, version: int, directory: str | Path) -> Any:
        request = adapter_request(version, directory)
        if not self._engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter of v{version} from {directory}")
        self._loaded = [r for r in self._loaded if r.lora_int_id != request.lora_int_id] + [request]
        while len(self._loaded) > self._keep:
            self._engine.remove_lora(self._loaded.pop(0).lora_int_id)
        return request
