"""The objective of one micro-batch, a pure function of its tensors: which pi_old the PPO ratio is
taken against (``old_logprobs``: vLLM's behaviour logprobs mu, or the learner's own from the
start of the step), the off-policy weights pi_old / mu that go with the learner's own, the
per-token aggregation over the whole mini-batch and the policy loss (learner/loss.py).

learner/engine.py runs the forwards, calls ``micro_objective`` and runs the backward of its loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from learner.loss import aggregation_weights, off_policy_weights, policy_loss
from learner.micro_batches import MicroBatch

if TYPE_CHECKING:
    from learner.config import LearnerConfig


@dataclass(frozen=True)
class MicroForwards:
    """What the forwards of one micro-batch gave, [B, T] tensors (0 where not scored).

    ``logp``: the policy's log p (with its graph); ``entropy``: the policy's entropy (None when not
    computed); ``reference``: the frozen reference's log p (None when the KL term is off);
    ``proximal``: pi_old, the policy's log p before this step's first optimizer step, when it was
    taken by an extra forward (``old_logprobs=recompute``, every mini-batch after the first),
    unmasked; None when this micro-batch's own forward ran at pi_old's weights."""

    logp: Any
    entropy: Any = None
    reference: Any = None
    proximal: Any = None


@dataclass(frozen=True)
class MiniBatchShare:
    """Where the micro-batch sits in its mini-batch: the mini-batch's scored tokens and sequences
    over every rank (the loss is normalised by the whole mini-batch, whatever the split), and
    ``loss_scale``: the world size (DeepSpeed averages gradients over ranks), 0 for a padding
    micro-batch (learner/rank_shards.py), which makes the same calls as the other ranks' and adds nothing."""

    tokens: int
    sequences: int
    loss_scale: float = 1.0


@dataclass(frozen=True)
class MicroObjective:
    """``loss`` to run the backward of (scaled by ``loss_scale``); ``metrics``: ``policy_loss``'s;
    ``learner_old``: the learner's pi_old the mismatch statistics compare mu with (under
    ``old_logprobs=behaviour`` the policy's own detached log p); ``is_weights`` and ``cut``: the
    off-policy weights and where they were truncated or masked (None under ``behaviour``)."""

    loss: Any
    metrics: dict[str, float]
    learner_old: Any
    is_weights: Any = None
    cut: Any = None


def micro_objective(
    forwards: MicroForwards, batch: MicroBatch, share: MiniBatchShare, cfg: LearnerConfig
) -> MicroObjective:
    """The loss of one micro-batch under ``cfg``'s ``old_logprobs``, ``loss`` and ``loss_agg``."""
    logp, mask, behaviour = forwards.logp, batch.mask, batch.behaviour
    if cfg.old_logprobs == "recompute":
        # The first mini-batch's forward runs at pi_old's weights: its own detached log p is pi_old.
        old = (forwards.proximal if forwards.proximal is not None else logp.detach()) * mask
        is_w, cut = off_policy_weights(old, behaviour, mask, cfg.loss)
    else:
        old, is_w, cut = behaviour, None, None
    weights = aggregation_weights(mask, cfg.loss_agg, share.tokens, share.sequences)
    loss, metrics = policy_loss(
        logp,
        old,
        batch.advantages.expand_as(logp),
        mask,
        cfg.loss,
        forwards.reference,
        forwards.entropy,
        token_normalizer=float(share.tokens),
        token_weights=weights,
        is_weights=is_w,
    )
    learner_old = logp.detach() * mask if old is behaviour else old
    if not share.loss_scale:  # padding: the same graph as the other ranks', no gradient
        loss = loss * 0.0
    elif share.loss_scale != 1.0:
        loss = loss * share.loss_scale
    return MicroObjective(loss, metrics, learner_old, is_w, cut)
