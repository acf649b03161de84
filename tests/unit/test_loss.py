"""The policy loss on small tensors, by hand."""
from __future__ import annotations

import math

import pytest
import torch

from learner.loss import LossConfig, low_var_kl, policy_loss

CFG = LossConfig(kl_coef=0.0)


def loss_of(ratio: float, adv: float, cfg=CFG) -> float:
    logp = torch.tensor([[math.log(ratio)]])
    old = torch.zeros((1, 1))
    loss, _ = policy_loss(logp, old, torch.tensor([[adv]]), torch.ones((1, 1)), cfg)
    return float(loss)


@pytest.mark.parametrize(
    "ratio, adv, expected",
    [
        (1.0, 2.0, -2.0),
        (1.5, 2.0, -2.4),  # clipped at 1.2
        (0.5, 2.0, -1.0),  # min(0.5 * 2, 0.8 * 2) -> -1.0 (pessimistic)
        (0.5, -2.0, 1.6),  # max(1.0, 1.6)
        (1.5, -2.0, 3.0),  # max(3.0, 2.4)
        (30.0, -2.0, 20.0),  # dual clip caps at c * |A| = 20
    ],
)
def test_clipped_surrogate_by_hand(ratio, adv, expected):
    assert loss_of(ratio, adv) == pytest.approx(expected, rel=1e-5)


def test_dual_clip_off():
    assert loss_of(30.0, -2.0, LossConfig(kl_coef=0.0, dual_clip=0.0)) == pytest.approx(60.0, rel=1e-5)


def test_token_mean_ignores_masked_tokens_and_accepts_a_normaliser():
    logp = torch.zeros((1, 4))
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    loss, _ = policy_loss(logp, logp, adv, mask, CFG)
    assert float(loss) == pytest.approx(-1.0)
    half, _ = policy_loss(logp, logp, adv, mask, CFG, token_normalizer=4.0)
    assert float(half) == pytest.approx(-0.5)


def test_low_variance_kl():
    assert float(low_var_kl(torch.tensor(0.3), torch.tensor(0.3))) == 0.0
    d = -0.5
    assert float(low_var_kl(torch.tensor(0.0), torch.tensor(d))) == pytest.approx(math.exp(d) - d - 1)
    logp = torch.zeros((1, 2), requires_grad=True)
    loss, metrics = policy_loss(logp, torch.zeros((1, 2)), torch.zeros((1, 2)), torch.ones((1, 2)), LossConfig(kl_coef=0.5), ref_logp=torch.full((1, 2), -0.5))
    assert metrics["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1) and float(loss.detach()) == pytest.approx(0.5 * metrics["kl"])


def test_gradient_flows_only_through_unmasked_tokens():
    logp = torch.zeros((1, 3), requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros((1, 3)), torch.ones((1, 3)), torch.tensor([[1.0, 0.0, 1.0]]), CFG)
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0


def test_bad_config():
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)
