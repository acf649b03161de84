"""Learner -> vLLM weight broadcast over NCCL (vLLM's StatelessProcessGroup + PyNcclCommunicator).

NCCL refuses two ranks of one communicator on the same GPU, so this needs
two: vLLM's worker on cuda:0, the learner's sending end on cuda:1 (the
learner itself stays on CPU; the broadcaster copies each tensor over).
The learner-side process and helpers are those of the CPU test.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_nccl_broadcast_equals_the_reload_path(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs the learner and vLLM on different GPUs")
    from test_weight_sync import HOST, expect, greedy, start_learner, write_perturbed

    from actors.generation.vllm_engine import VllmGenerator
    from weights.model_assets import resolve_model

    tiny = str(resolve_model("tiny"))
    new_dir = write_perturbed(tiny, tmp_path)
    gen = VllmGenerator(
        tiny, device="cuda", dtype="float32", max_model_len=4096, gpu_memory_utilization=0.3, weight_sync="broadcast"
    )
    proc, q, port = start_learner(new_dir, backend="nccl", device="cuda:1", zero_stage=0, rounds=1)
    try:
        _, before = greedy(gen)
        metadata = expect(q, "metadata", proc, timeout=300)
        assert gen.init_weight_group(HOST, port, world_size=2, timeout_s=300) == [1]
        gen.update_weights_from_group(1, metadata)
        _, via_broadcast = greedy(gen)
        assert via_broadcast.policy_version == 1 and via_broadcast.token_ids != before.token_ids
        gen.update_weights(2, new_dir)
        _, via_reload = greedy(gen)
        assert via_reload.token_ids == via_broadcast.token_ids
        assert via_reload.logprobs == pytest.approx(via_broadcast.logprobs, abs=1e-5)
        assert len(expect(q, "done", proc, timeout=60)) == 1
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
        gen.close()
    assert proc.exitcode == 0
