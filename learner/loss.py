"""The GRPO policy loss (docs/design.md: policy optimisation, off-policy control), pure functions of tensors.

PPO clipped surrogate (clip 0.2 both sides) with dual clip (c = 10) on
negative advantages, a low-variance (k3) KL penalty to the frozen reference
and an entropy bonus (coefficient 0 by default). Three policies meet here:
mu, the behaviour policy that generated the tokens (vLLM's logprobs); pi_old,
the proximal policy the PPO ratio is taken against (mu itself with
``old_logprobs=behaviour``, the learner's own logprobs at the start of the step
with ``recompute``); and pi, the policy being trained. With ``recompute`` the
loss is decoupled PPO: the clipped surrogate of pi / pi_old times an
off-policy weight pi_old / mu that PPO does not clip, truncated (TIS) or
masked (MIS) at the token or the sequence level (``is_correction``).

Per-token aggregation is a weight tensor (``aggregation_weights``) so that a
mini-batch split into micro-batches sums to the same loss whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# token-mean: one mean over every scored token of the mini-batch (DAPO, verl's
# default); seq-mean-token-mean: a token mean per sequence, averaged over the
# sequences (what the release computes with micro-batch 1); seq-mean-token-sum:
# a token sum per sequence, averaged over the sequences (Dr. GRPO-style).
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
IS_LEVELS = ("none", "token", "sequence")
IS_MODES = ("truncate", "mask")
KL_LOG_RATIO_CLAMP = 20.0  # verl clamps the log-ratio before exp: exp(d) of a masked token's huge gap is inf


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 10.0  # c > 1; 0 disables
    kl_coef: float = 0.001
    entropy_coef: float = 0.0
    # Off-policy weight pi_old / mu (only with old_logprobs=recompute):
    # none | token | sequence (the product over the sequence, in log space).
    is_level: str = "token"
    is_mode: str = "truncate"  # truncate: min(w, C) (TIS); mask: w = 0 outside [1/C, C] (MIS)
    is_threshold: float = 2.0  # C: 2 at token level, 5 to 10 at sequence level are typical

    def __post_init__(self) -> None:
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or 0 to disable), got {self.dual_clip}")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("clip ranges must be >= 0")
        if self.is_level not in IS_LEVELS:
            raise ValueError(f"is_level must be one of {', '.join(IS_LEVELS)}; got {self.is_level!r}")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"is_mode must be truncate or mask; got {self.is_mode!r}")
        if self.is_threshold <= 1.0:
            raise ValueError(f"is_threshold must be > 1, got {self.is_threshold}")


def low_var_kl(logp: Any, ref_logp: Any) -> Any:
    """k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - logp clamped to
    [-20, 20] before exp (as verl does: an unclamped huge gap gives inf, and its
    gradient NaN for the whole step even on a masked token), then to [-10, 10]."""
    import torch

    d = torch.clamp(ref_logp - logp, min=-KL_LOG_RATIO_CLAMP, max=KL_LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(d) - d - 1, min=-10.0, max=10.0)


def aggregation_weights(mask: Any, loss_agg: str, mini_tokens: float, mini_sequences: int) -> Any:
    """Per-token weights [B, T] whose weighted sum over a mini-batch is its loss.

    ``mask`` is one micro-batch's; ``mini_tokens`` and ``mini_sequences`` count the
    whole mini-batch (scored tokens, sequences), so micro-batches add up exactly.
    """

    mask = mask.float()
    if loss_agg == "token-mean":
        return mask / max(float(mini_tokens), 1.0)
    per_seq = mask.sum(dim=1, keepdim=True)
    if loss_agg == "seq-mean-token-mean":
        return mask / per_seq.clamp(min=1.0) / max(mini_sequences, 1)
    if loss_agg == "seq-mean-token-sum":
        return mask / max(mini_sequences, 1)
    raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGGS)}; got {loss_agg!r}")


def off_policy_weights(old_logp: Any, behaviour_logp: Any, mask: Any, cfg: LossConfig) -> tuple[Any, Any]:
    """(w, cut): the behaviour correction pi_old / mu per token [B, T] (no gradient), and
    where truncation or masking changed it. Sequence level uses the product over a
    sequence's scored tokens (a sum of log-ratios); every token of the sequence gets it."""
    import torch

    mask = mask.float()
    log_ratio = (old_logp - behaviour_logp).detach() * mask
    if cfg.is_level == "none":
        return torch.ones_like(log_ratio), torch.zeros_like(log_ratio, dtype=torch.bool)
    if cfg.is_level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    log_c = float(torch.log(torch.tensor(cfg.is_threshold)))
    log_ratio = log_ratio.clamp(min=-KL_LOG_RATIO_CLAMP, max=KL_LOG_RATIO_CLAMP)
    w = torch.exp(log_ratio)
    if cfg.is_mode == "truncate":
        cut = (log_ratio > log_c) & (mask > 0)
        w = torch.clamp(w, max=cfg.is_threshold)
    else:
        cut = ((log_ratio > log_c) | (log_ratio < -log_c)) & (mask > 0)
        w = torch.where(cut, torch.zeros_like(w), w)
    return w * mask, cut


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    token_normalizer: float | None = None,
    token_weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Any, dict[str, float]]:
    """All tensors [batch, tokens]; ``advantages`` broadcast per token; ``mask`` 1 on model tokens.

    Returns (loss, metrics). ``token_weights`` (from ``aggregation_weights``) aggregate
    the per-token terms; without them the loss is the token mean over this batch, or
    over ``token_normalizer`` tokens when this batch is one micro-batch of a larger one.
    ``is_weights`` (from ``off_policy_weights``) multiply the PPO term per token.
    Metrics are token means over ``token_normalizer`` (or this batch's) tokens, so
    micro-batch values add up to the mini-batch's.
    """
    import torch

    mask = mask.to(logp.dtype)
    n_tokens = mask.sum().clamp(min=1.0) if token_normalizer is None else torch.tensor(float(token_normalizer))
    weights = mask / n_tokens if token_weights is None else token_weights.to(logp.dtype)
    ratio = torch.exp(torch.clamp(logp - old_logp, min=-KL_LOG_RATIO_CLAMP, max=KL_LOG_RATIO_CLAMP))
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    clipped = torch.maximum(loss1, loss2)
    pg = clipped
    dual = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.dual_clip:
        # For A < 0 the clipped loss is unbounded in the ratio: cap it at -c A.
        dual = (advantages < 0) & (clipped > -advantages * cfg.dual_clip)
        pg = torch.where(advantages < 0, torch.minimum(clipped, -advantages * cfg.dual_clip), clipped)
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype)
    pg_loss = (pg * weights).sum()
    loss = pg_loss
    clipped_any = (loss2 > loss1).to(logp.dtype)

    def token_mean(x: Tensor) -> float:
        return float((x.detach().to(logp.dtype) * mask).sum() / n_tokens)

    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_frac": token_mean(clipped_any),
        "clip_frac_low": token_mean(clipped_any * (ratio < 1 - cfg.clip_low)),
        "clip_frac_high": token_mean(clipped_any * (ratio > 1 + cfg.clip_high)),
        "clip_frac_dual": token_mean(dual),
        "ratio_mean": token_mean(ratio),
    }
    if ref_logp is not None and cfg.kl_coef:
        kl_tok = low_var_kl(logp, ref_logp)
        kl = (kl_tok * weights).sum()
        loss = loss + cfg.kl_coef * kl
        metrics["kl"] = token_mean(kl_tok)
    if entropy is not None:
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * (entropy * weights).sum()
        metrics["entropy"] = token_mean(entropy)
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def mismatch_stats(behaviour_logp: Any, old_logp: Any, mask: Any) -> dict[str, float]:
    """Sums (to be divided by ``count``) and maxima of the behaviour/learner mismatch over
    scored tokens: k3 KL of mu vs pi_old (mean of exp(d) - d - 1, d = log mu - log pi_old)
    and |d|. Returned as sums so micro-batches and steps combine exactly."""
    import torch

    m = mask.float() > 0
    if not bool(m.any()):
        return {"count": 0.0, "kl_sum": 0.0, "kl_max": 0.0, "abs_diff_sum": 0.0}
    d = (behaviour_logp - old_logp).detach()[m].clamp(min=-KL_LOG_RATIO_CLAMP, max=KL_LOG_RATIO_CLAMP).double()
    k3 = torch.exp(d) - d - 1
    return {
        "count": float(m.sum()),
        "kl_sum": float(k3.sum()),
        "kl_max": float(k3.max()),
        "abs_diff_sum": float(d.abs().sum()),
    }


def is_weight_stats(w: Any, cut: Any, mask: Any) -> dict[str, float]:
    """Sums for the importance-weight metrics: mean, max, fraction truncated/masked and the
    effective sample size ESS = (sum w)^2 / (n sum w^2), over scored tokens."""
    m = mask.float() > 0
    if not bool(m.any()):
        return {"count": 0.0, "w_sum": 0.0, "w_sq_sum": 0.0, "w_max": 0.0, "cut": 0.0}
    wm = w.detach()[m].double()
    return {
        "count": float(m.sum()),
        "w_sum": float(wm.sum()),
        "w_sq_sum": float((wm * wm).sum()),
        "w_max": float(wm.max()),
        "cut": float(cut[m].sum()),
    }
