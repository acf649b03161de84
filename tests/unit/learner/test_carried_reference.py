"""The KL reference carried by the trajectories (trainer.reference_logprobs=generator) on the learner's
side, without a model: samples keep it, a micro-batch's tensors hold it aligned with its scored tokens
when every sample has it, and the group agrees per micro-batch where it is taken. The learner's step
with it (the same KL and update as its own reference forward): tests/integration/test_learner_lora.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from learner.batch import build_samples
from learner.micro_batches import collate
from learner.rank_shards import PAD_SAMPLE, agree_on_reference
from tests.unit.learner.test_learner_group_plan import sample, traj


def carried(s, values):
    return replace(s, reference_logprobs=values)


def test_samples_keep_it_and_a_stand_in_gets_zeros():
    a = replace(traj("g", 0, 4), reference_logprobs=[0.0, -1.0, -2.0, -3.0])
    b = replace(traj("g", 1, 4), padding=True, loss_mask=[0] * 4)
    c = traj("g", 2, 4)
    samples, _ = build_samples([a, b, c], {})
    assert [s.reference_logprobs for s in samples] == [[0.0, -1.0, -2.0, -3.0], [0.0] * 4, None]


def test_a_micro_batch_holds_it_aligned_with_what_it_scores():
    s1 = carried(sample("g", 3), [0.0, -0.5, -1.5, -2.5])
    s2 = carried(sample("g", 1), [0.0, -4.0])
    batch = collate([s1, s2], "cpu")
    assert batch.reference is not None and batch.reference.shape == batch.mask.shape == (2, 3)
    # position j holds the log-prob of token j + 1, as ``behaviour`` does; padding past a sample is 0
    assert torch.equal(batch.reference, torch.tensor([[-0.5, -1.5, -2.5], [-4.0, 0.0, 0.0]]))
    assert collate([s1, sample("g", 2)], "cpu").reference is None  # one without: the learner forwards


@pytest.mark.parametrize(
    "plan, want",
    [
        ([[[carried(sample("a", 2), [0.0] * 3)], [sample("b", 2)]]], [[True, False]]),
        ([[[PAD_SAMPLE]], [[carried(sample("a", 1), [0.0, -1.0])]]], [[True], [True]]),
        ([[[carried(sample("a", 1), [0.0, -1.0]), sample("a", 1)]]], [[False]]),
    ],
)
def test_one_rank_takes_it_where_every_sample_of_the_micro_batch_has_it(plan, want):
    assert agree_on_reference(plan, world_size=1) == want
