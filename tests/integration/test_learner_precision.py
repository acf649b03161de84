"""The learner's precision and RNG state: the KL reference computes in the policy's dtype inside
DeepSpeed's autocast check; checkpoints carry every CUDA device's RNG state."""

from __future__ import annotations

import contextlib

import pytest
import torch

from learner.ds_config import deepspeed_config, reference_config, torch_autocast_section
from learner.engine import Learner, LearnerConfig
from learner.loss import LossConfig


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


def test_both_engines_get_one_autocast_section():
    cfg = LearnerConfig(backend="deepspeed", zero_stage=3)
    for dtype in ("bfloat16", "float32"):
        policy, ref = deepspeed_config(cfg, 2, dtype, 1), reference_config(cfg, dtype)
        assert policy.get("torch_autocast") == ref.get("torch_autocast") == torch_autocast_section(dtype)
    assert torch_autocast_section("bfloat16")["dtype"] == "bfloat16" and torch_autocast_section("float32") is None


@contextlib.contextmanager
def cuda_autocast_flag():
    """What DeepSpeed's check sees on a GPU inside the learner's bf16 autocast: CUDA autocast on.
    ``autocast_if_enabled`` (deepspeed/runtime/torch_autocast.py) reads ``torch.is_autocast_enabled()``,
    which is CUDA's, and then switches autocast for the accelerator's device, here the CPU. This sets
    the real thread-local flag (CPU torch keeps it though it runs no CUDA kernel)."""
    torch.set_autocast_enabled("cuda", True)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", False)


def test_the_reference_forward_runs_in_bf16_where_deepspeed_checks_cuda_autocast(tiny_path):
    """Finding 3 of issue 26: without the policy's torch_autocast section DeepSpeed turned the learner's
    autocast off inside the reference engine's forward (on GPU), so the KL reference ran in fp32."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    cfg = LearnerConfig(
        backend="deepspeed",
        zero_stage=3,
        dtype="bfloat16",
        mini_batch_groups=1,
        micro_batch_size=1,
        loss=LossConfig(kl_coef=0.1),
    )
    lrn = Learner(tiny_path, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    assert isinstance(lrn.ref, DeepSpeedEngine) and isinstance(lrn.engine, DeepSpeedEngine)
    # The engines' own switches, as their forward reads them.
    assert lrn.ref.torch_autocast_enabled() and lrn.engine.torch_autocast_enabled()
    assert lrn.ref.torch_autocast_dtype() == lrn.engine.torch_autocast_dtype() == torch.bfloat16
    ids = torch.tensor([[5, 17, 99, 3, 41, 8]])
    with torch.no_grad(), lrn._autocast(), cuda_autocast_flag():
        ref_logits = lrn.ref(input_ids=ids).logits
        policy_logits = lrn.engine(input_ids=ids).logits
    assert policy_logits.dtype == torch.bfloat16
    assert ref_logits.dtype == torch.bfloat16, "the reference engine switched the learner's autocast off"
    # Same initial weights, same precision: the same logits.
    assert torch.equal(ref_logits, policy_logits)


def test_checkpoint_rng_carries_cuda_streams_only_where_cuda_is(tiny_path, tmp_path):
    """Without CUDA no "cuda" entry is written, and one written on a GPU machine restores nothing
    here (no CUDA stream draws on CPU) instead of failing the resume."""
    from learner.checkpoints import cuda_rng_state, set_cuda_rng_state

    cfg = LearnerConfig(
        backend="torch", optimizer="sgd", mini_batch_groups=1, micro_batch_size=1, loss=LossConfig(kl_coef=0.0)
    )
    lrn = Learner(tiny_path, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    lrn.save_checkpoint(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / "rng.pt", weights_only=False)
    assert ("cuda" in saved) == torch.cuda.is_available() == bool(cuda_rng_state(torch))
    if not torch.cuda.is_available():
        saved["cuda"] = [torch.zeros(16, dtype=torch.uint8)]  # as a one-GPU rank writes it
        torch.save(saved, tmp_path / "ckpt" / "rng.pt")
        set_cuda_rng_state(torch, saved, tmp_path / "ckpt")
        torch.manual_seed(123)
        lrn.load_checkpoint(tmp_path / "ckpt")  # the CPU streams still come back
        assert torch.equal(torch.get_rng_state(), saved["torch"])


@pytest.mark.gpu
def test_cuda_rng_streams_resume_exactly(tiny_path, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = LearnerConfig(
        backend="torch",
        device="cuda",
        optimizer="sgd",
        mini_batch_groups=1,
        micro_batch_size=1,
        loss=LossConfig(kl_coef=0.0),
    )
    lrn = Learner(tiny_path, cfg, group_size=1, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
    torch.cuda.manual_seed_all(7)
    lrn.save_checkpoint(tmp_path / "ckpt")
    want = [torch.randn(8, device=f"cuda:{d}") for d in range(torch.cuda.device_count())]
    torch.cuda.manual_seed_all(8)  # a different stream: a resume that skipped CUDA would draw from it
    lrn.load_checkpoint(tmp_path / "ckpt")
    got = [torch.randn(8, device=f"cuda:{d}") for d in range(torch.cuda.device_count())]
    assert all(torch.equal(w, g) for w, g in zip(want, got))
