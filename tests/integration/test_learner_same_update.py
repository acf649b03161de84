"""The learner's fast path makes the same update as the straightforward one.

New: the group's rollouts packed (shared prefix once, continuations side by side; on CPU the two
merged flash blocks) and the scored tokens' log p from the hidden states in chunks. Old: every
trajectory forwarded alone and log p from the whole vocabulary's logits (``logprob_head=full``), as
the learner computed before both changes. Loss, gradient norm and the parameters after one
optimizer step (plain SGD at lr 1: the update is the clipped gradient itself), ZeRO-2 on one rank
here; 2-rank ZeRO-3 in tests/integration/test_learner_group.py.
"""

from __future__ import annotations

import pytest

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from tests.integration.test_learner_engine import (  # noqa: F401 (tiny_path: the fixture)
    GROUPS,
    N,
    assert_same_update,
    make_batch,
    tiny_path,
    update_gap,
)
from weights.precision import BF16_CPU_FLAGS, read_cpu_flags

# bf16: both paths round the same matmul inputs to bf16; they differ in where sums are cut (chunks of
# the head's rows, the attention's two blocks merged in fp32 vs one kernel over the whole row, the
# prompt forwarded once vs per trajectory) and so in the bf16 roundings of partial results (2^-8
# relative each). The loss is a sum of ratio x advantage terms that nearly cancel over a group, so it
# is compared absolutely. Measured on AMD EPYC (avx512_bf16), 2026-12-06: loss 3.1e-5 apart, grad norm
# 6.6e-4 relative, the worst tensor's update 7.5e-3 of its norm (fp32 on the same batch: 1e-6). The
# bounds leave 6-7x room; a real error (a token dropped, a wrong normaliser, a lost KL term) moves the
# loss by 1e-2 and the updates by 1e-1 or more.
BF16_LOSS_ABS, BF16_NORM_REL, BF16_UPDATE_REL = 2e-4, 5e-3, 5e-2


def learner(tiny_path: str, new: bool, kl: float, dtype: str = "float32") -> Learner:
    cfg = LearnerConfig(
        backend="deepspeed",
        zero_stage=2,
        lr=1.0,
        optimizer="sgd",
        weight_decay=0.0,
        mini_batch_groups=GROUPS,
        micro_batch_size=N if new else 1,
        shared_prefix=new,
        logprob_head="chunked" if new else "full",
        loss=LossConfig(kl_coef=kl),
        dtype=dtype,
    )
    return Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def one_step(tiny_path, batch, new: bool, kl: float, dtype: str):
    lrn = learner(tiny_path, new, kl, dtype)
    before = lrn.weights_out.full_state_dict()
    out = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
    return before, out, lrn.weights_out.full_state_dict()


@pytest.mark.parametrize("kl", [0.1, 0.0], ids=["kl", "no-kl"])
def test_packed_chunked_update_equals_the_straightforward_one_fp32(tiny_path, kl):
    batch = make_batch(3, tiny_path, shared_prompt=True)
    before, old, after_old = one_step(tiny_path, batch, False, kl, "float32")
    _, new, after_new = one_step(tiny_path, batch, True, kl, "float32")
    assert new.forward_tokens < old.forward_tokens  # the prompt once per group: packing happened
    assert new.loss == pytest.approx(old.loss, rel=1e-5, abs=1e-7)
    assert new.grad_norm == pytest.approx(old.grad_norm, rel=1e-5)
    assert (new.kl is not None) == bool(kl) and (new.kl or 0.0) == pytest.approx(old.kl or 0.0, abs=1e-7)
    assert_same_update(before, after_old, after_new, f"packed + chunked vs unpacked + full, kl {kl}")


@pytest.mark.skipif(not (read_cpu_flags() & set(BF16_CPU_FLAGS)), reason="this CPU has no bf16 (fp32 only)")
def test_packed_chunked_update_equals_the_straightforward_one_bf16(tiny_path):
    batch = make_batch(3, tiny_path, shared_prompt=True)
    before, old, after_old = one_step(tiny_path, batch, False, 0.1, "bfloat16")
    _, new, after_new = one_step(tiny_path, batch, True, 0.1, "bfloat16")
    gaps = update_gap(before, after_old, after_new)
    worst = max(gaps, key=gaps.get)
    print(
        f"bf16: loss {new.loss:.6f} vs {old.loss:.6f}, grad norm {new.grad_norm:.6f} vs "
        f"{old.grad_norm:.6f}; worst update gap {gaps[worst]:.2e} ({worst})"
    )
    assert new.loss == pytest.approx(old.loss, abs=BF16_LOSS_ABS)
    assert new.grad_norm == pytest.approx(old.grad_norm, rel=BF16_NORM_REL)
    assert gaps[worst] <= BF16_UPDATE_REL, f"update of {worst} differs by {gaps[worst]:.2e} of its norm"
