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
    loss, metrics = policy_loss(
        logp,
        torch.zeros((1, 2)),
        torch.zeros((1, 2)),
        torch.ones((1, 2)),
        LossConfig(kl_coef=0.5),
        ref_logp=torch.full((1, 2), -0.5),
    )
    assert metrics["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1) and float(loss.detach()) == pytest.approx(
        0.5 * metrics["kl"]
    )


def test_gradient_flows_only_through_unmasked_tokens():
    logp = torch.zeros((1, 3), requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros((1, 3)), torch.ones((1, 3)), torch.tensor([[1.0, 0.0, 1.0]]), CFG)
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] != 0


def test_bad_config():
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)
    from learner.engine import LearnerConfig

    with pytest.raises(ValueError, match="loss_agg"):
        LearnerConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="old_logprobs"):
        LearnerConfig(old_logprobs="vllm")
    with pytest.raises(ValueError, match="is_level"):
        LossConfig(is_level="batch")
    with pytest.raises(ValueError, match="is_threshold"):
        LossConfig(is_threshold=1.0)


# ------------------------------------------------------------ aggregation
def _agg_loss(loss_agg: str) -> float:
    """Two sequences, per-token surrogate -A at ratio 1: sequence 0 has 1 token with A = 1,
    sequence 1 has 3 tokens with A = -1 (its 4th column is padding)."""
    from learner.loss import aggregation_weights

    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    logp = torch.zeros((2, 4))
    w = aggregation_weights(mask, loss_agg, mini_tokens=4, mini_sequences=2)
    loss, _ = policy_loss(logp, logp, adv, mask, CFG, token_weights=w)
    return float(loss)


def test_token_mean_by_hand():
    assert _agg_loss("token-mean") == pytest.approx((-1 + 3) / 4)  # every token counts once: 0.5


def test_seq_mean_token_mean_by_hand():
    assert _agg_loss("seq-mean-token-mean") == pytest.approx(
        (-1 + 1) / 2, abs=1e-6
    )  # each sequence's mean counts once: 0


def test_seq_mean_token_sum_by_hand():
    assert _agg_loss("seq-mean-token-sum") == pytest.approx((-1 + 3) / 2)  # sequence sums averaged: 1


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_add_up_to_the_mini_batch(loss_agg):
    from learner.loss import aggregation_weights

    torch.manual_seed(0)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1
    logp, old, adv = torch.randn(4, 6) * 0.1, torch.randn(4, 6) * 0.1, torch.randn(4, 1).expand(4, 6)
    tokens = float(mask.sum())
    whole, _ = policy_loss(logp, old, adv, mask, CFG, token_weights=aggregation_weights(mask, loss_agg, tokens, 4))
    parts = sum(
        float(
            policy_loss(
                logp[i : i + 2],
                old[i : i + 2],
                adv[i : i + 2],
                mask[i : i + 2],
                CFG,
                token_weights=aggregation_weights(mask[i : i + 2], loss_agg, tokens, 4),
            )[0]
        )
        for i in (0, 2)
    )
    assert parts == pytest.approx(float(whole), rel=1e-6)


# ------------------------------------------------------------ off-policy weights
def test_token_tis_truncates_and_mis_masks():
    from learner.loss import off_policy_weights

    mask = torch.ones((1, 3))
    old = torch.log(torch.tensor([[0.9, 0.5, 0.1]]))
    mu = torch.log(torch.tensor([[0.3, 0.5, 0.4]]))  # ratios pi_old / mu: 3, 1, 0.25
    w, cut = off_policy_weights(old, mu, mask, LossConfig(is_level="token", is_mode="truncate", is_threshold=2.0))
    assert w.tolist()[0] == pytest.approx([2.0, 1.0, 0.25]) and cut.tolist() == [[True, False, False]]
    w, cut = off_policy_weights(old, mu, mask, LossConfig(is_level="token", is_mode="mask", is_threshold=2.0))
    assert w.tolist()[0] == pytest.approx([0.0, 1.0, 0.0]) and cut.tolist() == [[True, False, True]]


def test_sequence_is_uses_the_product_over_scored_tokens():
    from learner.loss import off_policy_weights

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    old = torch.log(torch.tensor([[0.6, 0.8, 0.5], [0.2, 0.9, 0.9]]))
    mu = torch.log(torch.tensor([[0.3, 0.4, 0.001], [0.4, 0.1, 0.1]]))  # seq 0: 2 x 2 = 4 (padding ignored); seq 1: 0.5
    w, _ = off_policy_weights(old, mu, mask, LossConfig(is_level="sequence", is_mode="truncate", is_threshold=5.0))
    assert w.tolist() == [pytest.approx([4.0, 4.0, 0.0]), pytest.approx([0.5, 0.0, 0.0])]
    w, _ = off_policy_weights(old, mu, mask, LossConfig(is_level="sequence", is_mode="mask", is_threshold=3.0))
    assert w.tolist() == [pytest.approx([0.0, 0.0, 0.0]), pytest.approx([0.5, 0.0, 0.0])]


def test_is_weights_scale_the_ppo_term_but_not_its_gradient_path():
    """Decoupled PPO: w * surrogate(pi / pi_old); w carries no gradient."""
    logp = torch.zeros((1, 1), requires_grad=True)
    w = torch.tensor([[0.5]], requires_grad=True)
    loss, _ = policy_loss(
        logp, torch.zeros((1, 1)), torch.tensor([[2.0]]), torch.ones((1, 1)), CFG, is_weights=w.detach()
    )
    assert float(loss.detach()) == pytest.approx(-1.0)
    loss.backward()
    assert float(logp.grad) == pytest.approx(-1.0)  # d(-0.5 * 2 * exp(logp)) / dlogp at 0


def test_huge_kl_log_ratio_on_a_masked_token_keeps_the_gradient_finite():
    """Without the [-20, 20] clamp exp(200) is inf and the masked token's 0 * inf gradient is NaN."""
    logp = torch.tensor([[0.0, -200.0]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0]])
    loss, metrics = policy_loss(logp, logp.detach(), torch.ones((1, 2)), mask, LossConfig(kl_coef=0.1), ref_logp=ref)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and math.isfinite(metrics["kl"])


def test_clip_fractions_split_low_high_and_dual():
    logp = torch.log(torch.tensor([[1.5, 0.5, 30.0, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    _, m = policy_loss(logp, torch.zeros((1, 4)), adv, torch.ones((1, 4)), CFG)
    # token 0: A > 0, ratio 1.5 > 1.2 -> clipped high; token 1: A < 0, ratio 0.5 < 0.8 -> clipped low;
    # token 2: A < 0, ratio 30: PPO keeps the unclipped (larger) term, the dual clip caps it; token 3: neither.
    assert m["clip_frac_high"] == pytest.approx(0.25) and m["clip_frac_low"] == pytest.approx(0.25)
    assert m["clip_frac_dual"] == pytest.approx(0.25) and m["clip_frac"] == pytest.approx(0.5)


def test_mismatch_and_ess_by_hand():
    from learner.loss import is_weight_stats, mismatch_stats

    mask = torch.tensor([[1.0, 1.0, 0.0]])
    mu, old = torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[-1.0, -1.5, 0.0]])
    s = mismatch_stats(mu, old, mask)
    d = -0.5
    assert (
        s["count"] == 2
        and s["kl_sum"] == pytest.approx(math.exp(d) - d - 1)
        and s["abs_diff_sum"] == pytest.approx(0.5)
    )
    w = torch.tensor([[1.0, 3.0, 7.0]])
    st = is_weight_stats(w, torch.tensor([[False, True, True]]), mask)
    assert st["w_sum"] == 4.0 and st["w_sq_sum"] == 10.0 and st["cut"] == 1.0  # ESS = 16 / (2 * 10) = 0.8
