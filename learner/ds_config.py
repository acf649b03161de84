"""The DeepSpeed config a learner runs with: a pure function of its settings (unit tested)."""
from __future__ import annotations

from typing import Any


def deepspeed_config(cfg, grad_accum: int) -> dict[str, Any]:
    """ZeRO stage, accumulation, clipping and the offload switches of ``cfg`` (a LearnerConfig)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        # Optimizer state and its step on the host: ZeRO-2/3's largest share of memory (12 bytes/param under Adam).
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.device == "cuda"}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.device == "cuda"}  # ZeRO-3 only (checked in the config)
    return {
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
    }


def reference_config(cfg) -> dict[str, Any]:
    """The frozen KL reference under ZeRO-3: partitioned like the policy, no optimizer (OpenRLHF's eval config)."""
    zero: dict[str, Any] = {"stage": 3, "stage3_param_persistence_threshold": "auto"}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.device == "cuda"}
    return {"train_micro_batch_size_per_gpu": cfg.micro_batch_size, "zero_optimization": zero,
            "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 10**9}
