"""NaN must not pass the learner (issue 46 item 5): a step whose gradient norm is not finite applies
nothing, on every backend: weights and optimizer state stay as they were, the step counts it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from tests.integration.test_learner_engine import (  # noqa: F401 (tiny_path: the fixture)
    GROUPS,
    N,
    make_batch,
    tiny_path,
    weights,
)

# (backend, configured stage, offload): what DeepSpeed runs on one rank, and who holds the step.
SETUPS = {
    "torch": ("torch", 2, False),  # the learner skips optimizer.step
    "stage0": ("deepspeed", 2, False),  # zero2 on one rank runs stage 0: the learner holds the step
    "zero2": ("deepspeed", 2, True),  # offload keeps stage 2: DeepSpeed's ZeRO optimizer discards it
    "zero3": ("deepspeed", 3, False),
}


def learner(tiny_path: str, setup: str) -> Learner:
    backend, stage, offload = SETUPS[setup]
    cfg = LearnerConfig(
        backend=backend,
        zero_stage=stage,
        offload_optimizer=offload,
        lr=1e-3,  # AdamW: a step taken on a NaN gradient leaves NaN moments behind
        mini_batch_groups=GROUPS,
        loss=LossConfig(kl_coef=0.1),
        dtype="float32",
    )
    return Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def poisoned(batch: list) -> list:
    """The first trajectory with a NaN behaviour logprob on one scored token (a broken replica's)."""
    t = batch[0]
    at = t.loss_mask.index(1)
    return [replace(t, logprobs=[math.nan if i == at else lp for i, lp in enumerate(t.logprobs)]), *batch[1:]]


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_step_whose_gradient_norm_is_not_finite_applies_nothing(tiny_path, setup):
    clean, bad = make_batch(0, tiny_path), poisoned(make_batch(1, tiny_path))
    lrn = learner(tiny_path, setup)
    before = weights(lrn)
    result = lrn.train_batch(bad, {})
    assert result.nonfinite_grad_steps == 1 and result.grad_norm == 0.0
    after_bad = weights(lrn)
    assert all(torch.equal(before[k], after_bad[k]) for k in before), f"{setup}: the NaN step moved weights"
    healthy = lrn.train_batch(clean, {})  # the optimizer state was not poisoned either
    assert healthy.nonfinite_grad_steps == 0 and math.isfinite(healthy.grad_norm) and healthy.grad_norm > 0
    after = weights(lrn)
    lrn.close()
    assert all(bool(torch.isfinite(v).all()) for v in after.values())
    fresh = learner(tiny_path, setup)  # the same learner that never saw the NaN batch
    fresh.train_batch(clean, {})
    expected = weights(fresh)
    fresh.close()
    assert all(torch.equal(after[k], expected[k]) for k in after), f"{setup}: the held step left a trace"
