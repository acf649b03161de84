"""`seal plan` on GPUs that fractional asks share (seal/estimate/shared_gpus.py), and the recipe that
relies on it: qwen7b_lora_1x1, a 7B LoRA learner and its vLLM replica on one 80 GB GPU."""

from __future__ import annotations

import json

from seal.config import compose
from seal.estimate.memory import GB, LearnerSetup, learner_memory
from seal.estimate.plan import build_plan
from seal.estimate.shared_gpus import Tenant, learner_room_gb, overcommitted, pack_fractions
from tests.unit.seal.estimate.test_plan import QWEN7


def test_fractions_share_the_first_gpu_with_room():
    halves = [Tenant("generator", 0, 0.5, 28.0), Tenant("learner", 0, 0.5, 44.0), Tenant("env", 0, 0.5, None)]
    (shared,) = pack_fractions("node 0", 2, halves)  # the env actor's half alone on GPU 1: not shared
    assert [t.name for t in shared.tenants] == ["generator replica 0", "learner rank 0"]
    assert shared.memory_gb() == 72.0 and shared.share == 1.0
    room, others = learner_room_gb([shared], 80.0)
    assert room == 52.0 and [t.name for t in others] == ["generator replica 0"]
    # No GPU left for a fraction (whole asks took them): nothing shared, the placement reports it.
    assert pack_fractions("node 0", 0, halves) == []


def test_a_shared_gpu_without_a_learner_is_checked_by_its_tenants_sum():
    (gpu,) = pack_fractions("node 0", 1, [Tenant("generator", 0, 0.5, 68.0), Tenant("generator", 1, 0.5, 68.0)])
    (line,) = overcommitted([gpu], 80.0)
    assert line.startswith("GPU 0 of node 0 is shared by generator replica 0 (68.0 GB) and generator replica 1")
    assert line.endswith("136.0 GB of 80 GB")


def test_the_one_gpu_lora_recipe_fits_its_gpu_with_both_tenants():
    cfg = compose(["recipe=qwen7b_lora_1x1"])
    lc = cfg.learner.cfg
    # The paper's task settings; LoRA's own lr and rank (the recipe's header says why).
    assert (cfg.n, cfg.trainer.groups_per_step, lc.mini_batch_groups) == (8, 32, 8)
    assert (lc.loss.kl_coef, lc.loss.clip_low, lc.loss.dual_clip) == (0.001, 0.2, 10.0)
    assert (cfg.model.max_model_len - cfg.sampling.max_new_tokens, cfg.sampling.max_new_tokens) == (8192, 4096)
    assert (lc.lr, lc.lora.rank, lc.lora.publish, cfg.generator.weight_sync) == (1e-5, 16, "adapter", "reload")
    plan = build_plan(cfg, query=False)
    assert plan.fits, plan.problems
    hw = cfg.cluster.hardware
    assert (hw.nodes, hw.gpus_per_node, hw.gpu_gb) == (1, 1, 80) and not plan.layout.unplaced
    (gpu,) = plan.shared_gpus
    assert sorted(t.name for t in gpu.tenants) == ["generator replica 0", "learner rank 0"]
    assert gpu.memory_gb() <= 0.95 * 80  # headroom over the estimates
    # The learner's room is the GPU less vLLM's gpu_memory_utilization share, not half the GPU.
    assert plan.learner_capacity_gb == 80 - 0.35 * 80
    assert plan.learner_est.device_bytes / GB <= 0.9 * plan.learner_capacity_gb
    assert "reference" not in plan.learner_est.device  # the base with the adapter off is the reference
    assert plan.generator_est.sequences >= cfg.n  # a group's rollouts at max_model_len at once


def test_a_generator_taking_more_of_the_shared_gpu_leaves_the_learner_too_little():
    plan = build_plan(compose(["recipe=qwen7b_lora_1x1", "generator.gpu_memory_utilization=0.6"]), query=False)
    assert not plan.fits
    assert any(p.startswith("the learner needs 44.") and p.endswith("on 32 GB") for p in plan.problems), plan.problems


def test_a_fraction_of_a_gpu_is_a_tp1_replica_only():
    ok = build_plan(compose(["recipe=qwen7b_lora_1x1"]), query=False)
    assert not any("tensor_parallel_size" in p for p in ok.problems)
    bad = build_plan(compose(["recipe=qwen7b_lora_1x1", "generator.tensor_parallel_size=2"]), query=False)
    assert any("tensor_parallel_size=2 but cluster.generator.num_gpus=0.5" in p for p in bad.problems)


def test_a_lora_snapshot_merges_in_host_memory_unless_merged_weights_are_broadcast():
    ls = LearnerSetup(world_size=1, seq_len=12288, response_len=4096, lora_rank=16)
    host = learner_memory(QWEN7, ls)
    assert host.host["merged_model"] == 4 * QWEN7.params() and "merged_weights" not in host.device
    device = learner_memory(QWEN7, LearnerSetup(**{**ls.__dict__, "lora_merge_on_device": True}))
    assert device.phases["snapshot_merge"] == 4 * QWEN7.params() and "merged_model" not in device.host
    assert host.device_bytes < device.device_bytes - 15 * GB


def test_the_plan_json_lists_the_shared_gpu(capsys):
    from seal.commands.cli import main

    assert main(["plan", "--json", "recipe=qwen7b_lora_1x1"]) == 0
    out = json.loads(capsys.readouterr().out)
    (gpu,) = out["shared_gpus"]
    assert {t["actor"] for t in gpu["tenants"]} == {"generator replica 0", "learner rank 0"}
    assert out["learner"]["capacity_gb"] == 52.0 and "less what shares its GPU" in out["learner"]["capacity_note"]
