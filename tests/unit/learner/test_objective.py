"""The choice of objective for one micro-batch (learner/objective.py), on small tensors by hand."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import LearnerConfig
from learner.loss import LossConfig
from learner.micro_batches import MicroBatch
from learner.objective import MicroForwards, MiniBatchShare, micro_objective

# Two sequences of three scored positions; the second's last position is padding.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
MU = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 0.5]]))  # vLLM's behaviour logprobs
ADV = torch.tensor([[1.0], [-1.0]])


def batch() -> MicroBatch:
    ids = torch.zeros((2, 4), dtype=torch.long)
    return MicroBatch(ids, torch.ones_like(ids), MASK, MU * MASK, ADV)


def cfg(old_logprobs: str, is_threshold: float = 2.0, loss_agg: str = "token-mean") -> LearnerConfig:
    loss = LossConfig(kl_coef=0.0, is_threshold=is_threshold)
    return LearnerConfig(backend="torch", old_logprobs=old_logprobs, loss=loss, loss_agg=loss_agg)


def policy(values) -> torch.Tensor:
    return torch.log(torch.tensor(values)).requires_grad_(True)


PI = [[0.5, 0.5, 0.5], [0.25, 0.5, 0.5]]  # the policy now: equal to mu where scored


def test_behaviour_takes_the_ratio_against_mu_and_corrects_nothing():
    logp = policy(PI)
    out = micro_objective(MicroForwards(logp), batch(), MiniBatchShare(tokens=5, sequences=2), cfg("behaviour"))
    # ratio 1 everywhere: the loss is -sum(A) over the scored tokens / the mini-batch's 5 tokens
    assert float(out.loss) == pytest.approx(-(3 * 1.0 + 2 * -1.0) / 5)
    assert out.is_weights is None and out.cut is None
    assert torch.equal(out.learner_old, logp.detach() * MASK)  # the mismatch statistics compare mu with pi itself


def test_recompute_without_a_proximal_forward_is_the_policy_itself():
    logp = policy(PI)
    out = micro_objective(MicroForwards(logp), batch(), MiniBatchShare(5, 2), cfg("recompute"))
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    assert torch.equal(out.learner_old, logp.detach() * MASK)
    assert torch.allclose(out.is_weights, MASK)  # pi_old == mu on every scored token: weight 1


def test_recompute_takes_the_proximal_logprobs_and_truncates_their_weight():
    logp = policy(PI)
    # pi_old 4x mu on the first token of the first row: weight 4, truncated to the threshold 2
    proximal = torch.log(torch.tensor([[2.0, 0.5, 0.5], [0.25, 0.5, 0.9]]))
    out = micro_objective(MicroForwards(logp, proximal=proximal), batch(), MiniBatchShare(5, 2), cfg("recompute"))
    assert torch.equal(out.learner_old, proximal * MASK)  # masked: the padding position is 0
    assert float(out.is_weights[0, 0]) == pytest.approx(2.0)
    assert bool(out.cut[0, 0]) and int(out.cut.sum()) == 1
    # token 0 of row 0: ratio pi / pi_old = 1/4 under A = 1 (PPO keeps the lower 1/4), times the weight 2
    expected = -(0.25 * 2.0 + 2 * 1.0 + 2 * -1.0) / 5
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)


def test_loss_scale_multiplies_and_padding_keeps_the_graph_with_no_gradient():
    logp = policy(PI)
    one = micro_objective(MicroForwards(logp), batch(), MiniBatchShare(5, 2, 1.0), cfg("behaviour"))
    two = micro_objective(MicroForwards(logp), batch(), MiniBatchShare(5, 2, 2.0), cfg("behaviour"))
    assert float(two.loss) == pytest.approx(2 * float(one.loss))
    padding = micro_objective(MicroForwards(logp), batch(), MiniBatchShare(5, 2, 0.0), cfg("behaviour"))
    assert float(padding.loss) == 0.0
    padding.loss.backward()
    assert logp.grad is not None and not bool(logp.grad.any())


def test_sequence_mean_aggregation_weighs_each_sequence_once():
    logp = policy(PI)
    out = micro_objective(
        MicroForwards(logp), batch(), MiniBatchShare(5, 2), cfg("behaviour", loss_agg="seq-mean-token-mean")
    )
    # each sequence's token mean of -A, then the mean over the 2 sequences: (-1 + 1) / 2
    assert float(out.loss) == pytest.approx(0.0, abs=1e-7)
    assert math.isfinite(out.metrics["loss"])
