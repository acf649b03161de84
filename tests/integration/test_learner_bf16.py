"""A bf16 learner step (autocast, fp32 master weights) moves the policy the way an fp32 step does.

Skips on a processor without native bf16 (no amx_bf16/avx512_bf16 flag): there
``dtype: auto`` is fp32 and emulated bf16 would only be slow.
"""

from __future__ import annotations

import pytest
import torch

from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from tests.integration.test_learner_engine import GROUPS, N, make_batch, tiny_path  # noqa: F401 (fixture)
from weights.precision import BF16_CPU_FLAGS, read_cpu_flags, resolve_dtype

pytestmark = [
    pytest.mark.skipif(
        not set(BF16_CPU_FLAGS) & read_cpu_flags(),
        reason=f"this CPU has none of {', '.join(BF16_CPU_FLAGS)}: dtype auto is fp32 here",
    ),
]

# Measured on AMD EPYC (avx512_bf16), tiny model, one SGD step: 1 - cosine of the bf16 and fp32
# updates ~1e-5, norm ratio off by 6e-6, surrogate gains within 3e-5 relative (bf16's per-op errors,
# ~4e-3 relative, are random and average out over 7M parameters). The bounds are loose on purpose:
# other kernels and models round differently. A wrong bf16 path (a gradient lost in a
# cast, weights updated in bf16) breaks them by far more: a sign flip, or a norm off by 2x.
MIN_COSINE = 0.99
MAX_NORM_DRIFT = 0.1
MAX_GAIN_DRIFT = 0.2


def step_update(tiny_path, batch, dtype, backend="torch"):
    cfg = LearnerConfig(
        backend=backend,
        zero_stage=2,
        optimizer="sgd",
        lr=1.0,
        weight_decay=0.0,
        grad_clip=1e9,
        dtype=dtype,
        mini_batch_groups=GROUPS,
        micro_batch_size=2,
        loss=LossConfig(kl_coef=0.1),
    )
    lrn = Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    assert lrn.dtype == dtype
    before = {k: v.clone() for k, v in lrn.model.named_parameters()}
    lrn.train_batch(batch, {}, policy_version=0)
    assert all(p.dtype == torch.float32 for p in lrn.model.parameters())  # fp32 master weights
    update = torch.cat([(p.detach() - before[k].detach()).flatten() for k, p in lrn.model.named_parameters()])
    return update


def surrogate_gain(tiny_path, batch, update):
    """Change of sum(advantage-sign x log p) over the generated tokens, in fp32, after ``update`` (scaled small)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    adv = {}
    for t in batch:
        adv.setdefault(t.group_id, []).append(t.reward)
    sign = [t.reward - sum(adv[t.group_id]) / len(adv[t.group_id]) for t in batch]

    def objective():
        total = 0.0
        with torch.no_grad():
            for s, t in zip(sign, batch):
                ids = torch.tensor([t.token_ids])
                lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                picked = lp.gather(1, ids[0, 1:, None])[:, 0]
                total += s * float((picked * torch.tensor(t.loss_mask[1:], dtype=torch.float32)).sum())
        return total

    base = objective()
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.add_(1e-2 * update[offset : offset + n].view_as(p))
            offset += n
    return objective() - base


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_bf16_step_moves_the_loss_like_fp32(tiny_path, backend):
    assert resolve_dtype("auto", "cpu")[0] == "bfloat16"  # what the config default runs here
    batch = make_batch(3, tiny_path)
    u32 = step_update(tiny_path, batch, "float32", backend)
    u16 = step_update(tiny_path, batch, "bfloat16", backend)
    assert not torch.equal(u16, u32)  # bf16 really ran (DeepSpeed turns off an autocast it was not told of)
    cosine = float(torch.nn.functional.cosine_similarity(u32, u16, dim=0))
    drift = abs(float(u16.norm() / u32.norm()) - 1)
    g32, g16 = surrogate_gain(tiny_path, batch, u32), surrogate_gain(tiny_path, batch, u16)
    print(f"1 - cosine {1 - cosine:.2e} norm drift {drift:.2e} gain fp32 {g32:.5f} bf16 {g16:.5f}")
    assert cosine >= MIN_COSINE, cosine
    assert drift <= MAX_NORM_DRIFT, drift
    assert g32 > 0 and g16 > 0  # both steps raise the advantage-weighted likelihood: the loss goes down
    assert abs(g16 / g32 - 1) <= MAX_GAIN_DRIFT, (g16, g32)
