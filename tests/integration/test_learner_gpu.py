"""The learner on CUDA (NCCL): runs wherever CUDA (and DeepSpeed) are installed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend, stage", [("torch", 0), ("deepspeed", 2), ("deepspeed", 3)])
def test_cuda_step_matches_cpu(backend, stage):

    if backend == "deepspeed":
        pytest.importorskip("deepspeed")
    from test_learner_engine import make_batch, update_gap

    from env_pool.tags import RELEASED_BASE_WEIGHTS
    from learner.engine import Learner, LearnerConfig
    from weights.model_assets import prepare_tiny_model

    path = str(prepare_tiny_model())
    batch = make_batch(0, path)
    results = {}
    for device in ("cpu", "cuda"):
        # Plain SGD at lr 1: the update is the clipped gradient (Adam would magnify rounding on near-zero ones).
        cfg = LearnerConfig(
            backend=backend if device == "cuda" else "torch",
            zero_stage=stage,
            device=device,
            lr=1.0,
            optimizer="sgd",
            mini_batch_groups=2,
            micro_batch_size=1,
        )
        lrn = Learner(path, cfg, group_size=2, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)
        try:
            before = lrn.weights_out.full_state_dict()
            results[device] = (lrn.train_batch(batch, RELEASED_BASE_WEIGHTS), lrn.weights_out.full_state_dict())
        finally:
            # Its NCCL group goes with it: a later test's init_process_group in this process
            # (test_learner_collectives' NCCL group of one) raised "initialize ... twice".
            lrn.close()
    assert results["cuda"][0].loss == pytest.approx(results["cpu"][0].loss, rel=1e-3)
    # CUDA and CPU kernels differ more than two CPU paths do: 1e-3 of each tensor's update norm.
    gaps = update_gap(before, results["cpu"][1], results["cuda"][1])
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] <= 1e-3, (worst, gaps[worst])
