"""Infra-fault stand-ins in the learner's batch (issue 46 item 1): a micro-batch that scores nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from replay.queue import stand_in
from tests.integration.test_learner_engine import (  # noqa: F401 (tiny_path: the fixture)
    assert_same_update,
    make_batch,
    tiny_path,
    weights,
)


def one_group_with_a_stand_in(tiny_path: str) -> list:
    """Group 0 of the synthetic batch (rewards 0 and 1) and a third member the system ended."""
    a, b = make_batch(0, tiny_path)[:2]
    return [a, b, stand_in(a, replace(b, rollout_index=2))]


def learner(tiny_path: str, backend: str, stage: int, micro: int) -> Learner:
    cfg = LearnerConfig(
        backend=backend,
        zero_stage=stage,
        optimizer="sgd",  # lr 1: the update is the clipped gradient itself
        lr=1.0,
        weight_decay=0.0,
        mini_batch_groups=1,
        micro_batch_size=micro,
        loss=LossConfig(kl_coef=0.1),
        dtype="float32",
    )
    return Learner(tiny_path, cfg, group_size=3, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


@pytest.mark.parametrize("backend,stage", [("torch", 0), ("deepspeed", 2), ("deepspeed", 3)])
def test_a_micro_batch_of_a_stand_in_alone_trains_as_padding(tiny_path, backend, stage):
    """At micro_batch_size 1 the stand-in is a micro-batch of its own: it ran no forward, and the
    backward of a loss without a graph raised (torch: no grad_fn; DeepSpeed: "loss must be a scalar
    tensor"). Run as padding, the step is the one the stand-in makes beside its group's members."""
    batch = one_group_with_a_stand_in(tiny_path)
    assert [sum(t.loss_mask) > 0 for t in batch] == [True, True, False]
    updates = {}
    for micro in (1, 3):
        lrn = learner(tiny_path, backend, stage, micro)
        before = weights(lrn)
        result = lrn.train_batch(batch, {})
        updates[micro] = weights(lrn)
        assert result.grad_norm > 0 and result.scored_tokens == sum(sum(t.loss_mask) for t in batch)
        lrn.close()
    assert_same_update(before, updates[3], updates[1], f"{backend} stage {stage}: stand-in alone vs beside its group")
