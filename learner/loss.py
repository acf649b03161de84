"""The GRPO policy loss (DESIGN.md section 6), a pure function of tensors.

PPO clipped surrogate (clip 0.2 both sides) with dual clip (c = 10) on
negative advantages, importance ratio against the behaviour logprobs the
generator recorded, token-level mean over model-generated tokens only, a
low-variance (k3) KL penalty to the frozen reference, and an entropy bonus
(coefficient 0 by default, then not computed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 10.0  # c > 1; 0 disables
    kl_coef: float = 0.001
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or 0 to disable), got {self.dual_clip}")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("clip ranges must be >= 0")


def low_var_kl(logp: Any, ref_logp: Any) -> Any:
    """k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]."""
    import torch

    d = ref_logp - logp
    return torch.clamp(torch.exp(d) - d - 1, min=-10.0, max=10.0)


def policy_loss(logp, old_logp, advantages, mask, cfg: LossConfig, ref_logp=None, entropy=None,
                token_normalizer: float | None = None) -> tuple[Any, dict[str, float]]:
    """All tensors [batch, tokens]; ``advantages`` broadcast per token; ``mask`` 1 on model tokens.

    Returns (loss, metrics). The loss is the mean over unmasked tokens of the
    batch (token-level aggregation); ``token_normalizer`` replaces the token
    count when this batch is one micro-batch of a larger mini-batch.
    """
    import torch

    mask = mask.to(logp.dtype)
    n_tokens = mask.sum().clamp(min=1.0) if token_normalizer is None else torch.tensor(float(token_normalizer))
    ratio = torch.exp(logp - old_logp)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    clipped = torch.maximum(loss1, loss2)
    pg = clipped
    if cfg.dual_clip:
        # For A < 0 the clipped loss is unbounded in the ratio: cap it at -c A.
        pg = torch.where(advantages < 0, torch.minimum(clipped, -advantages * cfg.dual_clip), clipped)
    pg_loss = (pg * mask).sum() / n_tokens
    loss = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_frac": float(((loss2 > loss1).to(logp.dtype) * mask).sum() / n_tokens),
        "ratio_mean": float((ratio.detach() * mask).sum() / n_tokens),
    }
    if ref_logp is not None and cfg.kl_coef:
        kl = (low_var_kl(logp, ref_logp) * mask).sum() / n_tokens
        loss = loss + cfg.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if entropy is not None and cfg.entropy_coef:
        ent = (entropy * mask).sum() / n_tokens
        loss = loss - cfg.entropy_coef * ent
        metrics["entropy"] = float(ent.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics
