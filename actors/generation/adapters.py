"""Policy versions as LoRA adapters on a vLLM engine that serves the base model once.

With ``max_lora_rank`` > 0 an engine starts with vLLM's LoRA serving (``enable_lora``,
``max_lora_rank``, ``max_loras`` adapter slots: engine_settings.py). A publish is then the
learner's adapter directory (peft's adapter_config.json + adapter_model.safetensors, written by
learner/lora.py ``write_adapter``), megabytes where a full publish sends the model: the engine
loads it eagerly (``add_lora``: a file that does not load fails the publish, not a later request)
and every later request carries its ``LoRARequest``. Version v is adapter id v + 1 (vLLM's ids
start at 1). ``AdapterSlots`` keeps the newest ``keep`` versions loaded and removes older ones,
so a replica holds at most ``max_loras`` adapters.

Through the fleet's weight-sync paths a publish carries the adapter's tensors alone (``adapter_config``,
``write_adapter_files``: the replica writes peft's directory itself), and the async replica keeps each
version while a request uses it (``ServedAdapters``, driven by actors/generation/adapter_updates.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from actors.generation.episode_pins import droppable
from weights.layer_names import linear_layer_names

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


def lora_engine_args(max_lora_rank: int, max_loras: int, model_dir: str | Path) -> dict[str, Any]:
    """vLLM's engine keywords for LoRA serving of ``model_dir``; none when ``max_lora_rank`` is 0.
    Adapters go on the model's linear layers only: with the output head wrapped too, prompt
    log-probs (the weight canary) beside other requests kill the engine (weights/layer_names.py)."""
    check_lora_slots(max_lora_rank, max_loras)
    if not max_lora_rank:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": max_lora_rank,
        "max_loras": max_loras,
        "lora_target_modules": linear_layer_names(model_dir),
    }


# The zero adapter's LoRA id (ServedAdapters.base): above any version's (version + 1).
BASE_ADAPTER_ID = 2**30


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


# --------------------------------------------------------------- adapters from tensors
# A publish through the fleet's weight-sync paths (Ray's object store, the broadcast group) carries
# the adapter's tensors alone, under peft's saved names (learner/lora.py ``adapter_tensors``), with
# each B already scaled by alpha / rank: vLLM folds that scaling into B when it loads an adapter
# (LoRALayerWeights.optimize), so the learner does it first and the wire needs no config at all.
# The replica writes them as peft's directory with lora_alpha = r (scaling 1) and loads it by path,
# vLLM's one way in (a path also lets its LRU cache reload an evicted adapter).
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


def adapter_config(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """peft's adapter_config.json for pre-scaled adapter ``tensors``: the rank from the A matrices
    (one rank for all), the target modules from the names, alpha = rank (scaling 1)."""
    ranks = {int(t.shape[0]) for name, t in tensors.items() if name.endswith(LORA_A)}
    if len(ranks) != 1:
        raise ValueError(f"adapter tensors must hold lora_A matrices of one rank, found ranks {sorted(ranks)}")
    odd = [n for n in tensors if not n.endswith((LORA_A, LORA_B))]
    if odd:
        raise ValueError(f"not adapter tensors (lora_A / lora_B weights): {odd[:3]}")
    rank = ranks.pop()
    targets = sorted({name.removesuffix(LORA_A).rsplit(".", 1)[-1] for name in tensors if name.endswith(LORA_A)})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,  # B arrives scaled by the learner's alpha / rank
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def write_adapter_files(directory: str | Path, tensors: Mapping[str, Any]) -> tuple[Path, int]:
    """``tensors`` (name -> torch tensor) as peft's adapter directory under ``directory``, written
    beside it and renamed into place, so vLLM never reads half a file. Returns (path, bytes)."""
    from safetensors.torch import save_file

    out = Path(directory)
    config = adapter_config(tensors)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file({n: t.detach().contiguous().cpu() for n, t in tensors.items()}, str(tmp / ADAPTER_FILES[1]))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out, sum(f.stat().st_size for f in out.iterdir())


def read_adapter_files(directory: str | Path) -> dict[str, Any]:
    """The tensors of an adapter directory (tests; a replica restoring from a file)."""
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / ADAPTER_FILES[1]))


class ServedAdapters:
    """The adapters an async replica serves (actors/generation/async_vllm_engine.py): every version
    stays loaded while a request uses it and the newest always does; an older one goes (removed from
    the engine, its directory deleted) once no request uses it. New requests take the newest.

    Unlike ``AdapterSlots`` (the blocking engine: updates land between batches), requests here run
    across updates, so a version is held by use, not by count: vLLM schedules at most ``max_loras``
    adapters in a batch and reloads an evicted one from its directory, so more versions in use than
    slots cost throughput, never a wrong adapter."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._requests: dict[int, Any] = {}  # version -> LoRARequest, oldest first
        self._users: dict[int, int] = {}  # version -> requests using it now
        self._base: Any = None  # the zero adapter (``base``), once one is needed

    async def base(self, engine: Any) -> Any:
        """The LoRARequest that serves the base model exactly, for requests that must not see any
        adapter (the KL reference): None while no adapter was ever loaded, else a zero adapter.

        Why not None throughout: vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops``) pick each
        token's adapter by indexing the stacked slots with its LoRA index, and a token without an
        adapter has index -1, which torch reads as the last slot (skipped only where a prefill batch
        is one run of -1). Measured on the tiny model: prompt log-probs asked with no adapter once one
        had been loaded came back 0.44 nats per token off the base; a request decoding on the base
        across the first publish stayed on it (tests/integration/test_lora_async_generation.py). An
        adapter of zeros in the newest's shapes adds exactly 0 to every layer. Loaded once, never dropped."""
        newest = self.newest
        if newest is None:
            return None
        if self._base is None:
            zeros = {name: t.new_zeros(t.shape) for name, t in read_adapter_files(self.directory(newest)).items()}
            directory, _ = write_adapter_files(self.root / "base", zeros)
            from vllm.lora.request import LoRARequest

            request = LoRARequest(lora_name="base-zero", lora_int_id=BASE_ADAPTER_ID, lora_path=str(directory))
            if not await engine.add_lora(request):
                raise RuntimeError(f"vLLM did not load the zero adapter from {directory}")
            self._base = request
        return self._base

    @property
    def newest(self) -> int | None:
        return next(reversed(self._requests), None)

    def directory(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def request(self, version: int | None) -> Any:
        """The LoRARequest of ``version``; None (the base model) for a version never loaded."""
        return None if version is None else self._requests.get(version)

    def loaded(self) -> list[int]:
        return list(self._requests)

    def users(self, version: int) -> int:
        return self._users.get(version, 0)

    async def add(self, engine: Any, version: int) -> Any:
        """Load the adapter written to ``directory(version)`` (eagerly: a bad file fails the update,
        not a later request) and make it the newest; returns what the engine's ``add_lora`` took."""
        request = adapter_request(version, self.directory(version))
        if not await engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter of v{version} from {request.lora_path}")
        self._requests.pop(version, None)
        self._requests[version] = request
        return request

    def acquire(self, version: int) -> Any:
        """A request starts on ``version``: held until ``release``. Returns its LoRARequest."""
        self._users[version] = self._users.get(version, 0) + 1
        return self.request(version)

    def release(self, version: int) -> None:
        left = self._users.get(version, 0) - 1
        if left > 0:
            self._users[version] = left
        else:
            self._users.pop(version, None)

    async def drop_unused(self, engine: Any, pinned: Collection[int] = ()) -> list[int]:
        """Remove every version but the newest that no request uses and no episode is ``pinned`` to
        (actors/generation/episode_pins.py ``droppable``); returns them."""
        dropped = []
        for version in droppable(list(self._requests), self.newest, self._users, pinned):
            request = self._requests.pop(version)
            await engine.remove_lora(request.lora_int_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)
            dropped.append(version)
        return dropped


def adapter_slots(by_hand: int | None, default: int, reference_from_base: bool) -> int:
    """The LoRA slots (vLLM's ``max_loras``: distinct adapters in one batch) a replica starts with:
    those set by hand, else the engine's ``default`` and, where the replicas score the KL reference
    (trainer.reference_logprobs=generator), one more for the zero adapter those requests use
    (``ServedAdapters.base``): without it a group's scoring requests and episodes on two policy
    versions would take turns for the slots."""
    if by_hand is not None:
        return by_hand
    return default + 1 if reference_from_base else default


def serving_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds a rank-``rank`` adapter."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"a rank-{rank} adapter is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")
    return fitting[0]


def adapter_serving_spec(
    generator: Mapping[str, Any], adapter_rank: int | None, max_lora_rank: int | None, async_engine: bool
) -> dict:
    """The generator's constructor arguments for a learner that publishes a rank-``adapter_rank``
    adapter (learner.cfg.lora with ``publish: adapter``; None: it publishes whole weights): LoRA
    serving on, ``max_lora_rank`` the smallest vLLM rank holding the adapter unless the one set by
    hand (generator.max_lora_rank, None if not) holds it. Only the async replica takes adapters
    through the fleet's paths; the blocking one is refused with what to set instead. Any other
    learner: ``generator`` unchanged."""
    spec = dict(generator)
    if adapter_rank is None:
        return spec
    if not async_engine:
        raise ValueError(
            "learner.cfg.lora.publish=adapter needs the async generator (generator=vllm_async_cpu or "
            "vllm_async_gpu); with the blocking engine set learner.cfg.lora.publish=merged"
        )
    given = max_lora_rank or 0
    if given and given < adapter_rank:
        raise ValueError(f"generator.max_lora_rank={given} cannot serve the learner's rank-{adapter_rank} adapter")
    spec["max_lora_rank"] = given or serving_rank(adapter_rank)
    return spec
