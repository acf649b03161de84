"""The DeepSpeed configs a learner runs with: pure functions of its settings (unit tested)."""

from __future__ import annotations

from typing import Any


def torch_autocast_section(dtype: str) -> dict[str, Any] | None:
    """The ``torch_autocast`` section every engine of a learner computing in ``dtype`` gets, the
    policy's and the KL reference's alike (None in fp32).

    The learner runs its forwards under its own bf16 autocast (learner/engine.py ``_autocast``);
    an engine without this section turns an outer autocast off inside its forward ("enabled
    outside DeepSpeed but disabled within": deepspeed/runtime/torch_autocast.py
    ``autocast_if_enabled``, whose check reads CUDA's autocast, so only on GPU): a reference
    without it ran in fp32 there. No module reduces its gradients in bf16 (the empty list):
    gradients, master weights and optimizer state stay fp32, as with plain torch.
    """
    if dtype != "bfloat16":
        return None
    return {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}


def _with_autocast(config: dict[str, Any], dtype: str) -> dict[str, Any]:
    section = torch_autocast_section(dtype)
    return {**config, "torch_autocast": section} if section else config


def effective_zero_stage(cfg, world_size: int) -> int:
    """The ZeRO stage DeepSpeed runs: ``cfg.zero_stage``, but 0 for stage 1 or 2 on a single rank
    without offload. There is nothing to partition across one rank, and the partition machinery
    still runs: every gradient copied into its bucket and "reduced" over a group of one, the flat
    fp32 partition copied back into the parameters after each step. On the main job's shape that was
    a tenth of the learner's step (docs/benchmarks.md). The update is the same (tests hold stage 0, 2
    and plain torch to one another). Stage 3 stays: its partitioned loading shapes how the model is
    built."""
    if world_size == 1 and cfg.zero_stage in (1, 2) and not (cfg.offload_optimizer or cfg.offload_param):
        return 0
    return cfg.zero_stage


def deepspeed_config(cfg, grad_accum: int, dtype: str, world_size: int) -> dict[str, Any]:
    """ZeRO stage, accumulation, clipping and the offload switches of ``cfg`` (a LearnerConfig);
    ``dtype``: the resolved compute dtype (``Learner.dtype``); ``world_size``: the learner's ranks."""
    zero: dict[str, Any] = {"stage": effective_zero_stage(cfg, world_size)}
    if cfg.offload_optimizer:
        # Optimizer state and its step on the host: ZeRO-2/3's largest share of memory (12 bytes/param under Adam).
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.device == "cuda"}
    if cfg.offload_param:
        zero["offload_param"] = {
            "device": "cpu",
            "pin_memory": cfg.device == "cuda",
        }  # ZeRO-3 only (checked in the config)
    return _with_autocast(
        {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": grad_accum,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": zero,
            "bf16": {"enabled": False},
            "fp16": {"enabled": False},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            # ZeRO lists torch's Adam/AdamW as tested; plain SGD works the same way through it.
            "zero_allow_untested_optimizer": cfg.optimizer == "sgd",
            # Offloaded optimizer state with torch's own optimizer (DeepSpeedCPUAdam needs a compiled op).
            "zero_force_ds_cpu_optimizer": False,
        },
        dtype,
    )


def reference_config(cfg, dtype: str) -> dict[str, Any]:
    """The frozen KL reference under ZeRO-3: partitioned like the policy, no optimizer (OpenRLHF's
    eval config), computing in the policy's ``dtype`` (the same autocast section)."""
    zero: dict[str, Any] = {"stage": 3, "stage3_param_persistence_threshold": "auto"}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.device == "cuda"}
    return _with_autocast(
        {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "zero_optimization": zero,
            "bf16": {"enabled": False},
            "fp16": {"enabled": False},
            "steps_per_print": 10**9,
        },
        dtype,
    )
