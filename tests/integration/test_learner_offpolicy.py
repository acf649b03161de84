"""The learner's off-policy options on CPU: recomputed old logprobs, partial mini-batches,
the mismatch and importance-weight metrics, aggregation through the engine."""

from __future__ import annotations

import math

import pytest
from test_learner_engine import GROUPS, N, assert_same_update, make_batch, weights

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


def make_learner(tiny_path, backend="torch", stage=2, groups_per_mini=GROUPS, **cfg):
    cfg.setdefault("loss", LossConfig(kl_coef=0.1))
    cfg.setdefault("dtype", "float32")  # equivalence checks: fp32 on every processor
    return Learner(
        tiny_path,
        LearnerConfig(
            backend=backend,
            zero_stage=stage,
            lr=1e-3,
            weight_decay=0.0,
            mini_batch_groups=groups_per_mini,
            micro_batch_size=1,
            **cfg,
        ),
        group_size=N,
        world_size=1,
        timeout_s=600.0,
        step_timeout_s=3600.0,
    )


def test_recomputed_old_logprobs_are_the_weights_before_the_first_step(tiny_path):
    """Two mini-batches: the second one's pi_old is the policy before the batch's first step."""
    from learner.batch import build_samples
    from tests.integration.hf_logprobs import sequence_logprobs

    lrn = make_learner(tiny_path, groups_per_mini=1, old_logprobs="recompute")
    samples, _ = build_samples(make_batch(0, tiny_path), RELEASED_BASE_WEIGHTS)
    plan = lrn._mini_batch_plan(samples, allow_partial=False)
    assert len(plan) == 2
    proximal = lrn._proximal_logprobs(plan)
    second = [s for micro in plan[1] for s in micro]
    assert set(proximal) == {id(s) for s in second}  # the first mini-batch needs no extra forward
    for s in second:
        expected = sequence_logprobs(lrn.model, s.token_ids)[1:]
        got = proximal[id(s)]
        for j, m in enumerate(s.loss_mask[1:]):
            if m:
                assert abs(float(got[j]) - expected[j]) < 1e-5


def test_recompute_reports_mismatch_and_importance_weights(tiny_path):
    batch = make_batch(1, tiny_path)  # behaviour logprobs = the model's own + U(-0.05, 0.05) noise
    out = make_learner(tiny_path, old_logprobs="recompute").train_batch(batch, RELEASED_BASE_WEIGHTS, policy_version=0)
    # One mini-batch: pi_old is the training forward itself, so the PPO ratio is exactly 1.
    assert out.ratio_mean == pytest.approx(1.0, abs=1e-6)
    # k3 of a gap of at most 0.05 is at most exp(0.05) - 1.05 ~ 1.3e-3; it is not zero.
    assert 0 < out.mismatch_kl <= out.mismatch_kl_max <= 1.3e-3
    assert 0 < out.mismatch_abs_logprob_diff <= 0.05 + 1e-5
    assert out.mismatch_tokens == sum(sum(t.loss_mask) - t.loss_mask[0] for t in batch)
    assert 0.95 < out.is_weight_mean < 1.05 and out.is_truncated_frac == 0.0 and 0.99 < out.ess <= 1.0
    assert all(math.isfinite(getattr(out, k)) for k in ("entropy", "clip_frac_low", "clip_frac_high", "clip_frac_dual"))
    # Generated at another version: no same-weights mismatch to report.
    other = make_learner(tiny_path, old_logprobs="recompute").train_batch(
        batch, RELEASED_BASE_WEIGHTS, policy_version=3
    )
    assert other.mismatch_kl is None and other.offpolicy_kl == pytest.approx(out.offpolicy_kl, rel=1e-5)


def test_behaviour_old_logprobs_take_the_ratio_against_vllm(tiny_path):
    batch = make_batch(1, tiny_path)
    out = make_learner(tiny_path, old_logprobs="behaviour").train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert out.ratio_mean != pytest.approx(1.0, abs=1e-4)  # the noise in mu shows in the ratio
    assert out.is_weight_mean == 1.0 and out.mismatch_kl > 0


@pytest.mark.parametrize("backend, stage", [("torch", 0), ("deepspeed", 2), ("deepspeed", 3)])
def test_a_partial_last_mini_batch_takes_its_own_step(tiny_path, backend, stage):
    """3 groups with mini-batches of 2: steps of 2 and 1 groups; ZeRO (the boundary set by us) = torch."""
    batch = make_batch(2, tiny_path) + [t for t in make_batch(3, tiny_path) if t.group_id.endswith("g0")]
    strict = make_learner(tiny_path, backend, stage, optimizer="sgd")
    with pytest.raises(ValueError, match="whole mini-batches"):
        strict.train_batch(batch, RELEASED_BASE_WEIGHTS)
    ref = make_learner(tiny_path, "torch", 0, optimizer="sgd")
    before = weights(ref)
    a = ref.train_batch(batch, RELEASED_BASE_WEIGHTS, allow_partial=True)
    lrn = make_learner(tiny_path, backend, stage, optimizer="sgd")
    b = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS, allow_partial=True)
    assert a.mini_batches == b.mini_batches == 2 and lrn.step == 2
    assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-7)
    assert_same_update(before, weights(ref), weights(lrn), f"{backend} partial mini-batch")


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_sequence_aggregation_is_split_invariant_in_the_engine(tiny_path, loss_agg):
    batch = make_batch(4, tiny_path)
    one = make_learner(tiny_path, optimizer="sgd", loss_agg=loss_agg)
    cfg = LearnerConfig(
        backend="torch",
        lr=1e-3,
        weight_decay=0.0,
        optimizer="sgd",
        mini_batch_groups=GROUPS,
        micro_batch_size=2,
        loss_agg=loss_agg,
        loss=LossConfig(kl_coef=0.1),
        dtype="float32",
    )
    two = Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    before = weights(one)
    ma, mb = one.train_batch(batch, RELEASED_BASE_WEIGHTS), two.train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert ma.loss == pytest.approx(mb.loss, rel=1e-5)
    assert_same_update(before, weights(one), weights(two), loss_agg)
    token_mean = make_learner(tiny_path, optimizer="sgd").train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert ma.loss != pytest.approx(token_mean.loss, rel=1e-3)  # a different aggregation, really


def test_no_reference_model_without_a_kl_term(tiny_path):
    lrn = make_learner(tiny_path, loss=LossConfig(kl_coef=0.0))
    assert lrn.ref is None
    out = lrn.train_batch(make_batch(5, tiny_path), RELEASED_BASE_WEIGHTS)
    assert out.kl is None and math.isfinite(out.loss)
