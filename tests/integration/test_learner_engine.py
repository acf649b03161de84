"""The learner engine on CPU: ZeRO-2/3 match plain torch; checkpoints resume exactly."""

from __future__ import annotations

import os
import random

import pytest
import torch

from env_pool import tags as T
from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig
from replay.messages import Segment, Trajectory

GROUPS, N = 2, 2


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


def make_batch(seed: int, tiny_path: str, shared_prompt: bool = False) -> list[Trajectory]:
    """Synthetic groups: a prompt, two generated spans, behaviour logprobs from
    the model itself plus noise (so ratios differ from 1), mixed rewards."""
    from transformers import AutoModelForCausalLM

    from tests.integration.hf_logprobs import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    rng = random.Random(seed)
    out = []
    for g in range(GROUPS):
        group_prompt = [rng.randrange(100, 5000) for _ in range(12)]
        for i in range(N):
            # As rollouts are: one prompt per group (shared_prompt), or, harder for batching, one per rollout.
            prompt = group_prompt if shared_prompt else [rng.randrange(100, 5000) for _ in range(12)]
            gen1 = [rng.randrange(100, 5000) for _ in range(rng.randint(3, 8))]
            tool = [rng.randrange(100, 5000) for _ in range(5)]
            gen2 = [rng.randrange(100, 5000) for _ in range(rng.randint(2, 6))]
            ids = prompt + gen1 + tool + gen2
            mask = [0] * len(prompt) + [1] * len(gen1) + [0] * len(tool) + [1] * len(gen2)
            lps = sequence_logprobs(model, ids)
            logprobs = [lp + rng.uniform(-0.05, 0.05) if m else 0.0 for lp, m in zip(lps, mask)]
            s1 = Segment(len(prompt), len(prompt) + len(gen1), 0)
            s2 = Segment(len(ids) - len(gen2), len(ids), 0)
            out.append(
                Trajectory(
                    task_id=f"t{g}",
                    category="base",
                    env="toy",
                    group_id=f"s{seed}g{g}",
                    rollout_index=i,
                    interface_version=0,
                    token_ids=ids,
                    loss_mask=mask,
                    logprobs=logprobs,
                    prompt_length=len(prompt),
                    segments=[s1, s2],
                    reward=float((i + g) % 2),
                    success=bool((i + g) % 2),
                    progress=0.5,
                    tags=[T.PASS if (i + g) % 2 else T.STATE_MISMATCH, T.EMPTY_TURN],
                    labels=[T.PASS, T.MISSING_TOOL_CALL],
                    error_type=None,
                    outcome="completed",
                    num_tool_calls=1,
                    num_steps=2,
                )
            )
    return out


def learner(tiny_path, backend, stage=2, micro=1, checkpointing=False, shared_prefix=False, optimizer="adamw"):
    # Equivalence tests use plain SGD at lr 1: the update is then the clipped gradient itself.
    lr = 1.0 if optimizer == "sgd" else 1e-3
    cfg = LearnerConfig(
        backend=backend,
        zero_stage=stage,
        lr=lr,
        optimizer=optimizer,
        weight_decay=0.0,
        mini_batch_groups=GROUPS,
        micro_batch_size=micro,
        loss=LossConfig(kl_coef=0.1),
        gradient_checkpointing=checkpointing,
        shared_prefix=shared_prefix,
        dtype="float32",
    )  # pinned: the tolerances below are fp32's
    return Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def weights(lrn):
    return lrn.weights_out.full_state_dict()


# Different summation orders (ZeRO's flat buffers, micro-batch splits, packed
# attention, recomputation) change a gradient by rounding only. Measured on AMD
# EPYC (fp32, 2 threads), as a share of each tensor's update norm, worst tensor:
# ZeRO-2 and ZeRO-3 vs torch 6.9e-6, packing 1.8e-6, micro-batch split and
# checkpointing 0. The bound leaves over 10x room for other x86-64 kernels; a
# real error (a token dropped, a wrong normaliser) moves it by 1e-2 or more.
REL_TOLERANCE = 1e-4


def update_gap(before: dict, after_a: dict, after_b: dict) -> dict[str, float]:
    """Per parameter: |update_a - update_b| / |update_a|, in float64 (SGD at lr 1: update = clipped gradient).

    The weights are fp32, so w - g itself rounds by up to eps32 * |w| per
    element; that part is allowed on top of the relative bound."""
    eps = torch.finfo(torch.float32).eps
    gaps = {}
    for k, w0 in before.items():
        w0 = w0.double()
        da, db = w0 - after_a[k].double(), w0 - after_b[k].double()
        rounding = float((eps * (w0.abs() + after_a[k].double().abs() + after_b[k].double().abs())).norm())
        excess = max(0.0, float((da - db).norm()) - rounding)
        gaps[k] = excess / max(float(da.norm()), 1e-30) if excess else 0.0
    return gaps


def assert_same_update(before: dict, after_a: dict, after_b: dict, what: str) -> None:
    assert any(not torch.equal(before[k], after_a[k]) for k in after_a), f"{what}: nothing moved"
    gaps = update_gap(before, after_a, after_b)
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] <= REL_TOLERANCE, f"{what}: update of {worst} differs by {gaps[worst]:.2e} of its norm"


def test_zero2_and_zero3_match_a_plain_torch_step(tiny_path):
    batch = make_batch(0, tiny_path)
    results = {}
    for name, lrn in [
        ("torch", learner(tiny_path, "torch", optimizer="sgd")),
        ("zero2", learner(tiny_path, "deepspeed", 2, optimizer="sgd")),
        ("zero3", learner(tiny_path, "deepspeed", 3, optimizer="sgd")),
    ]:
        before = weights(lrn)
        results[name] = (lrn.train_batch(batch, RELEASED_BASE_WEIGHTS), weights(lrn))
    ref_metrics, ref_w = results["torch"]
    for name in ("zero2", "zero3"):
        metrics, w = results[name]
        assert metrics.loss == pytest.approx(ref_metrics.loss, rel=1e-5, abs=1e-7), name
        assert metrics.grad_norm == pytest.approx(ref_metrics.grad_norm, rel=1e-4), name
        assert_same_update(before, ref_w, w, name)


def test_zero3_matches_torch_under_adamw_too(tiny_path):
    """The training optimizer through ZeRO-3: after one Adam step every weight moved by at
    most lr (Adam's step is bounded by lr per element), and moved the same way as torch's
    wherever the gradient is not near zero (there Adam's 1/sqrt(v) amplifies rounding)."""
    batch = make_batch(0, tiny_path)
    torch_lrn, zero3 = learner(tiny_path, "torch"), learner(tiny_path, "deepspeed", 3)
    before = weights(torch_lrn)
    torch_lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
    zero3.train_batch(batch, RELEASED_BASE_WEIGHTS)
    wt, wz = weights(torch_lrn), weights(zero3)
    lr = torch_lrn.cfg.lr
    agree = total = 0
    for k in before:
        dt, dz = before[k] - wt[k], before[k] - wz[k]
        assert float(dz.abs().max()) <= lr * 1.01, k
        # Adam's first step is lr * sign(g) where |g| >> eps: the direction must agree there.
        firm = dt.abs() > 0.5 * lr
        agree += int((torch.sign(dt[firm]) == torch.sign(dz[firm])).sum())
        total += int(firm.sum())
    assert total > 0 and agree == total


def test_micro_batch_split_does_not_change_the_update(tiny_path):
    batch = make_batch(1, tiny_path)
    a, b = learner(tiny_path, "torch", micro=1, optimizer="sgd"), learner(tiny_path, "torch", micro=2, optimizer="sgd")
    before = weights(a)
    ma, mb = a.train_batch(batch, RELEASED_BASE_WEIGHTS), b.train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert ma.loss == pytest.approx(mb.loss, rel=1e-5)
    assert_same_update(before, weights(a), weights(b), "micro-batch 2 vs 1")


def test_gradient_checkpointing_computes_the_same_update(tiny_path):
    batch = make_batch(2, tiny_path)
    plain = learner(tiny_path, "deepspeed", 2, optimizer="sgd")
    recomputed = learner(tiny_path, "deepspeed", 2, checkpointing=True, optimizer="sgd")
    assert recomputed.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    before = weights(plain)
    mp, mr = plain.train_batch(batch, RELEASED_BASE_WEIGHTS), recomputed.train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert mr.loss == pytest.approx(mp.loss, rel=1e-5, abs=1e-7)
    assert_same_update(before, weights(plain), weights(recomputed), "gradient checkpointing")


def test_gradient_checkpointing_is_chosen_per_micro_batch_from_its_length(tiny_path):
    """learner.cfg.gradient_checkpointing_min_tokens: micro-batches shorter than it keep their activations,
    longer ones recompute them; the update is the same either way."""
    import dataclasses

    batch = make_batch(2, tiny_path)
    longest = max(len(t.token_ids) for t in batch)
    plain = learner(tiny_path, "deepspeed", 2, optimizer="sgd")
    before = weights(plain)
    reference = plain.train_batch(batch, RELEASED_BASE_WEIGHTS)
    for threshold, recompute in ((longest + 1, False), (1, True)):
        lrn = learner(tiny_path, "deepspeed", 2, checkpointing=True, optimizer="sgd")
        lrn.cfg = dataclasses.replace(lrn.cfg, gradient_checkpointing_min_tokens=threshold)
        got = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
        assert lrn.model.is_gradient_checkpointing is recompute, threshold
        assert got.loss == pytest.approx(reference.loss, rel=1e-5, abs=1e-7)
        assert_same_update(before, weights(plain), weights(lrn), f"checkpointing threshold {threshold}")


@pytest.mark.parametrize("backend, checkpointing", [("torch", False), ("deepspeed", True)])
def test_shared_prefix_packing_computes_the_same_update(tiny_path, backend, checkpointing):
    batch = make_batch(7, tiny_path, shared_prompt=True)
    plain = learner(tiny_path, backend, micro=1, checkpointing=checkpointing, optimizer="sgd")
    packed = learner(tiny_path, backend, micro=N, checkpointing=checkpointing, shared_prefix=True, optimizer="sgd")
    before = weights(plain)
    mp, mk = plain.train_batch(batch, RELEASED_BASE_WEIGHTS), packed.train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert mk.forward_tokens <= mp.forward_tokens - (N - 1) * GROUPS * 12  # each group's prompt went through once
    assert mk.loss == pytest.approx(mp.loss, rel=1e-5, abs=1e-7)
    assert mk.grad_norm == pytest.approx(mp.grad_norm, rel=1e-4)
    assert_same_update(before, weights(plain), weights(packed), "shared-prefix packing")


def test_sgd_update_is_the_clipped_gradient(tiny_path):
    """What the equivalence tests rely on: under optimizer=sgd the update is lr x the clipped gradient."""
    batch = make_batch(3, tiny_path)
    lrn = learner(tiny_path, "torch", optimizer="sgd")
    before = weights(lrn)
    grads = {}
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.detach().clone()))
        for n, p in lrn.model.named_parameters()
    ]
    metrics = lrn.train_batch(batch, RELEASED_BASE_WEIGHTS)
    for h in hooks:
        h.remove()
    clip = min(1.0, lrn.cfg.grad_clip / (metrics.grad_norm + 1e-6))
    after = weights(lrn)
    for n, g in grads.items():
        expected = before[n] - lrn.cfg.lr * clip * g
        assert torch.allclose(after[n], expected, rtol=1e-5, atol=1e-7), n


@pytest.mark.parametrize("backend, stage", [("torch", 0), ("deepspeed", 2), ("deepspeed", 3)])
def test_checkpoint_resume_is_exact(tiny_path, tmp_path, backend, stage):
    b1, b2 = make_batch(2, tiny_path), make_batch(3, tiny_path)
    first = learner(tiny_path, backend, stage)
    first.train_batch(b1, RELEASED_BASE_WEIGHTS)
    first.save_checkpoint(tmp_path / "ckpt", extra={"capability": {"version": 7}, "interface": {"version": 2}})
    first.train_batch(b2, RELEASED_BASE_WEIGHTS)
    expected = weights(first)

    resumed = learner(tiny_path, backend, stage)
    extra = resumed.load_checkpoint(tmp_path / "ckpt")
    assert extra == {"capability": {"version": 7}, "interface": {"version": 2}} and resumed.step == 1
    resumed.train_batch(b2, RELEASED_BASE_WEIGHTS)
    got = weights(resumed)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_resume_loads_the_step_learner_json_names_not_an_unfinished_save(tiny_path, tmp_path):
    """DeepSpeed's rank 0 points `latest` at a tag before the other ranks' shards are written; a rank
    lost then leaves `latest` ahead of the last complete checkpoint, which learner.json names."""
    b1, b2 = make_batch(2, tiny_path), make_batch(3, tiny_path)
    first = learner(tiny_path, "deepspeed", 2)
    first.train_batch(b1, RELEASED_BASE_WEIGHTS)
    first.save_checkpoint(tmp_path / "ckpt")
    expected = weights(first)
    first.train_batch(b2, RELEASED_BASE_WEIGHTS)
    first.engine.save_checkpoint(str(tmp_path / "ckpt"), tag="step0000002")  # stops before learner.json
    assert (tmp_path / "ckpt" / "latest").read_text() == "step0000002"

    resumed = learner(tiny_path, "deepspeed", 2)
    resumed.load_checkpoint(tmp_path / "ckpt")
    got = weights(resumed)
    assert resumed.step == 1 and all(torch.equal(got[k], expected[k]) for k in expected)


def test_save_snapshot_writes_a_loadable_versioned_snapshot(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM

    lrn = learner(tiny_path, "torch")
    lrn.train_batch(make_batch(4, tiny_path), RELEASED_BASE_WEIGHTS)
    path, seconds = lrn.weights_out.save_snapshot(tmp_path / "weights", version=1, step=lrn.step)
    assert path.name == "v000001" and seconds < 30
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    mine = weights(lrn)
    assert all(torch.equal(loaded[k], mine[k]) for k in loaded)


def test_incomplete_mini_batches_are_refused(tiny_path):
    lrn = learner(tiny_path, "torch")
    with pytest.raises(ValueError, match="whole mini-batches"):
        lrn.train_batch(make_batch(5, tiny_path)[:N], RELEASED_BASE_WEIGHTS)


def test_learner_scores_exactly_the_masked_tokens(tiny_path):
    from learner.batch import build_samples
    from tests.integration.hf_logprobs import sequence_logprobs

    lrn = learner(tiny_path, "torch", micro=2)
    batch = make_batch(6, tiny_path)
    samples, _ = build_samples(batch, RELEASED_BASE_WEIGHTS)
    micro = lrn._collate(samples[:2])
    mask = micro.mask
    logp, _, _ = lrn._logprobs(lrn.ref, samples[:2], micro)
    for row, sample in enumerate(samples[:2]):
        full = sequence_logprobs(lrn.ref, sample.token_ids)[1:]
        for j, m in enumerate(sample.loss_mask[1:]):
            if m:
                assert abs(float(logp[row, j]) - full[j]) < 1e-5
            else:
                assert float(logp[row, j]) == 0.0 or mask[row, j] == 0


@pytest.mark.parametrize("backend, stage", [("torch", 0), ("deepspeed", 3)])
def test_generator_weights_carry_a_tied_parameter_once(tiny_path, backend, stage):
    lrn = learner(tiny_path, backend, stage)
    assert lrn.model.config.tie_word_embeddings
    full, sent = lrn.weights_out.full_state_dict(), lrn.weights_out.generator_weights()
    assert "lm_head.weight" in full and "lm_head.weight" not in sent
    assert set(sent) == set(full) - {"lm_head.weight"}
    assert all(torch.equal(sent[k], full[k]) for k in sent)


def test_the_one_process_group_leaves_no_rendezvous_port_to_children(tiny_path):
    """A fresh process (nothing initialised torch.distributed before): after a DeepSpeed learner
    starts, MASTER_PORT is gone again, so Ray workers or a `seal train` started from this
    process do not try to bind the port the learner's store still holds."""
    import subprocess
    import sys

    code = (
        "import os; from learner.engine import Learner, LearnerConfig; "
        f"Learner({tiny_path!r}, LearnerConfig(backend='deepspeed', mini_batch_groups=1, micro_batch_size=1), group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0); "
        "import torch.distributed as d; print(d.is_initialized(), 'MASTER_PORT' in os.environ)"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=True)
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout[-500:] + out.stderr[-2000:]


def test_a_stale_torch_extension_lock_does_not_stop_a_learner(tiny_path, tmp_path):
    """A lock file left in the torch extensions dir by a process killed mid-build (what hung CI
    for an hour on 2026-12-03) must not make a DeepSpeed learner wait: training needs no JIT op."""
    import subprocess
    import sys

    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ext = tmp_path / "torch_extensions"
    lock = ext / ShareMemCommBuilder.NAME / "lock"  # TORCH_EXTENSIONS_DIR holds the build dirs directly
    lock.parent.mkdir(parents=True)
    lock.touch()
    code = (
        "from learner.engine import Learner, LearnerConfig; "
        f"lrn = Learner({tiny_path!r}, LearnerConfig(backend='deepspeed', mini_batch_groups=1, micro_batch_size=1), group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0); "
        "import deepspeed.comm.comm as c; print('shm op', c.cdb.shm_comm_op)"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["TORCH_EXTENSIONS_DIR"] = str(ext)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=True)
    assert out.stdout.split()[-3:] == ["shm", "op", "None"], out.stdout[-500:] + out.stderr[-2000:]
    assert lock.exists() and not any(p.suffix == ".so" for p in lock.parent.iterdir())
