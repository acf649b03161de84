"""The learner's settings (the ``learner.cfg`` config group), checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.batch import APatchConfig
from learner.lora import LoraConfig
from learner.loss import LOSS_AGGS, LossConfig
from weights.precision import check_dtype


@dataclass(frozen=True)
class LearnerConfig:
    backend: str = "deepspeed"  # deepspeed | torch
    zero_stage: int = 2
    device: str = "cpu"
    # adamw (training) | sgd: plain SGD (no momentum), whose update is -lr * the
    # clipped gradient, so equivalence tests compare gradients rather than
    # Adam's division by sqrt(v), which magnifies rounding on near-zero ones.
    optimizer: str = "adamw"
    lr: float = 1e-6
    weight_decay: float = 0.01  # AdamW's decoupled decay; the release's (verl's AdamW default)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    mini_batch_groups: int = 8  # groups per optimizer step
    micro_batch_size: int = 2  # trajectories per forward/backward
    seed: int = 0
    # Recompute activations in backward: a 7K-token BFCL trajectory otherwise
    # keeps about 1.4 MB of activations per token on CPU (fp32, 30 layers).
    gradient_checkpointing: bool = False
    # ... but only for micro-batches that forward at least this many tokens (padded, or packed):
    # below it the activations fit and recomputing them costs a third more compute. 0: always.
    gradient_checkpointing_min_tokens: int = 0
    # Forward the rollouts of a group that share a micro-batch as one packed
    # sequence: their common prompt once (learner/packing.py). Only takes
    # effect when micro_batch_size >= 2, i.e. when rollouts of one group meet.
    shared_prefix: bool = False
    # The PPO old policy: behaviour (vLLM's logprobs) | recompute (the learner's own at
    # the start of the step: decoupled PPO, behaviour -> proximal -> current, with the
    # loss's is_* settings correcting for the behaviour/proximal gap). The release's default.
    old_logprobs: str = "recompute"
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum (learner/loss.py)
    # How scored tokens' log p and entropy come out of the output head: chunked (a chunk of rows at a
    # time, no [tokens x vocabulary] tensor kept for the backward: learner/token_logprobs.py) | full
    # (the whole vocabulary's logits, as a plain forward gives them: the reference the tests compare with).
    logprob_head: str = "chunked"
    # DeepSpeed offload to host memory: optimizer state (ZeRO-2/3), parameters (ZeRO-3 only).
    offload_optimizer: bool = False
    offload_param: bool = False
    weight_bucket_mb: float = 256.0  # weights leave a ZeRO-3 group gathered this many MB at a time
    # Compute dtype: auto (bf16 where the CPU has AMX/AVX512-BF16: weights/precision.py) | bfloat16 | float32.
    # bf16 is torch autocast around the forwards: weights, gradients and optimizer state stay
    # fp32, so checkpoints and the equivalence tests are the same in both. The code default is
    # fp32 (tests compare backends exactly); the config files say auto.
    dtype: str = "float32"
    loss: LossConfig = field(default_factory=LossConfig)
    apatch: APatchConfig = field(default_factory=APatchConfig)
    # LoRA adapters instead of every weight (learner/lora.py); None or rank None: full training.
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("deepspeed", "torch"):
            raise ValueError(f"backend must be deepspeed or torch, got {self.backend!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be adamw or sgd, got {self.optimizer!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0..3, got {self.zero_stage}")
        if self.old_logprobs not in ("behaviour", "recompute"):
            raise ValueError(f"old_logprobs must be behaviour or recompute, got {self.old_logprobs!r}")
        if self.logprob_head not in ("chunked", "full"):
            raise ValueError(f"logprob_head must be chunked or full, got {self.logprob_head!r}")
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGGS)}; got {self.loss_agg!r}")
        if self.mini_batch_groups < 1 or self.micro_batch_size < 1 or self.gradient_checkpointing_min_tokens < 0:
            raise ValueError(
                "mini_batch_groups and micro_batch_size must be >= 1, gradient_checkpointing_min_tokens >= 0"
            )
        if self.offload_param and (self.backend != "deepspeed" or self.zero_stage != 3):
            raise ValueError(
                "offload_param needs backend=deepspeed and zero_stage=3 (parameters are whole on every rank below it)"
            )
        if self.offload_optimizer and (self.backend != "deepspeed" or self.zero_stage < 1):
            raise ValueError("offload_optimizer needs backend=deepspeed with zero_stage >= 1")
        if self.weight_bucket_mb <= 0:
            raise ValueError(f"weight_bucket_mb must be > 0, got {self.weight_bucket_mb}")

        check_dtype(self.dtype)
