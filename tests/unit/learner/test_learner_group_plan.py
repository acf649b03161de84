"""The learner group's pure parts: group assignment, mini-batch plans, padding, merged metrics, pruning, DeepSpeed config."""

from __future__ import annotations

from dataclasses import replace

import pytest

from learner.batch import Sample
from learner.checkpoints import tags_to_prune
from learner.ds_config import deepspeed_config
from learner.engine import LearnerConfig
from learner.rank_shards import (
    PAD_SAMPLE,
    agree_on_mini_batches,
    assign_groups,
    assigned_mini_batches,
    is_padding,
    pad_plan,
    shard_batch,
)
from learner.step_result import learner_row, merge_results
from replay.messages import Trajectory
from tests.unit.learner.step_results import step_result


def traj(group: str, i: int, length: int) -> Trajectory:
    return Trajectory(
        task_id=group,
        category="base",
        env="toy",
        group_id=group,
        rollout_index=i,
        interface_version=0,
        token_ids=[1] * length,
        loss_mask=[0] + [1] * (length - 1),
        logprobs=[0.0] * length,
        prompt_length=1,
        segments=[],
        reward=float(i),
        success=bool(i),
        progress=0.0,
        tags=[],
        labels=[],
        error_type=None,
        outcome="completed",
        num_tool_calls=0,
        num_steps=1,
    )


def sample(group: str, tokens: int) -> Sample:
    return Sample([1] * (tokens + 1), [0] + [1] * tokens, [0.0] * (tokens + 1), 1.0, 1.0, 1.0, tokens, group)


def test_groups_go_largest_first_to_the_least_loaded_rank():
    assert assign_groups([10, 50, 20, 30], 2) == [[0, 1], [2, 3]]  # 50 / 30, 20 / then 10 on the tie: the lower rank
    assert assign_groups([5, 5, 5], 1) == [[0, 1, 2]]
    assert assign_groups([7], 3) == [[0], [], []]
    loads = [sum([9, 1, 8, 2, 7, 3][i] for i in rank) for rank in assign_groups([9, 1, 8, 2, 7, 3], 3)]
    assert max(loads) - min(loads) <= 1
    with pytest.raises(ValueError):
        assign_groups([1], 0)


def test_every_group_lands_whole_on_exactly_one_rank():
    batch = [traj(f"g{g}", i, 3 + 5 * g) for g in range(5) for i in range(2)]
    shards = shard_batch(batch, 2, mini_batch_groups=5)
    seen = [t.group_id for s in shards for t in s.trajectories]
    assert sorted(seen) == sorted(t.group_id for t in batch)
    for s in shards:
        assert {t.group_id for t in s.trajectories} == {g for mini in s.mini_groups for g in mini}
    assert all(len(s.mini_groups) == 1 for s in shards)
    tokens = [sum(len(t.token_ids) for t in s.trajectories) for s in shards]
    assert abs(tokens[0] - tokens[1]) <= 2 * (3 + 5 * 4)  # within one group's size


def test_each_mini_batch_is_split_on_its_own_and_every_rank_sees_every_mini_batch():
    batch = [traj(f"g{g}", i, 4) for g in range(3) for i in range(2)]
    shards = shard_batch(batch, 2, mini_batch_groups=2)  # minis: [g0, g1], [g2] (partial)
    assert [s.mini_groups for s in shards] == [[["g0"], ["g2"]], [["g1"], []]]


def test_plan_pads_short_ranks_with_zero_weight_micro_batches():
    samples = [sample("a", 3), sample("a", 4), sample("b", 2), sample("b", 5)]
    plan = assigned_mini_batches(samples, [["a", "b"], []], micro_batch_size=1)
    assert [len(m) for m in plan] == [4, 0]
    padded, tokens, seqs = agree_on_mini_batches(plan, world_size=1)
    assert [len(m) for m in padded] == [4, 1] and is_padding(padded[1][0]) and tokens == [14, 0] and seqs == [4, 0]
    assert [len(m) for m in pad_plan(plan, [6, 2])] == [6, 2]
    with pytest.raises(ValueError):
        pad_plan(plan, [3, 1])
    with pytest.raises(ValueError, match="disagree"):
        assigned_mini_batches(samples, [["a"]], 1)
    assert PAD_SAMPLE.num_tokens == 0 and sum(PAD_SAMPLE.loss_mask[1:]) == 1  # one scored position: a real forward


def test_a_micro_batch_that_scores_nothing_is_run_as_padding():
    """Issue 46 item 1: an infra fault's stand-in (loss mask all 0) alone in a micro-batch would skip its
    forward; it becomes a padding micro-batch (a forward and a backward at loss x 0), its counts kept."""
    stand_in = replace(sample("a", 3), loss_mask=[0, 0, 0, 0], num_tokens=0)
    mixed = [sample("a", 2), stand_in]
    plan = [[[sample("a", 2)], [stand_in]], [mixed, [stand_in, stand_in]]]
    padded, tokens, seqs = agree_on_mini_batches(plan, world_size=1)
    assert [[is_padding(m) for m in mini] for mini in padded] == [[False, True], [False, True]]
    assert padded[1][0] == mixed  # a stand-in beside a scored sample rides along in its forward
    assert tokens == [2, 2] and seqs == [2, 4]  # the loss normalisers count what they counted before


def test_merged_metrics_add_loss_terms_and_counts():
    a = step_result(loss=0.25, kl=0.1, grad_norm=2.0, seconds=2.0, samples_per_s=2.0, scored_tokens=10, groups=1)
    b = step_result(loss=0.5, kl=0.2, grad_norm=2.0, seconds=4.0, samples_per_s=1.0, scored_tokens=30, groups=2)
    m = merge_results([a, b])
    assert m.loss == 0.75 and m.kl == pytest.approx(0.3) and m.grad_norm == 2.0 and m.groups == 3
    assert m.seconds == 4.0 and m.samples_per_s == 2.0 and m.tokens_per_s == 10.0 and m.learner_world_size == 2
    assert merge_results([a, replace(b, kl=None)]).kl == 0.1 and merge_results([a]) is a
    assert merge_results([replace(a, entropy=None), replace(b, entropy=None)]).entropy is None  # never computed


def test_the_row_takes_the_learners_figures_and_a_skipped_step_none_of_them():
    row = learner_row(replace(step_result(loss=0.5, samples_per_s=3.0), tag_weights={"pass": 1.0}))
    assert row["loss"] == 0.5 and row["learner_samples_per_s"] == 3.0 and row["tag_weights"] == {"pass": 1.0}
    assert learner_row(None).keys() == row.keys() and set(learner_row(None).values()) == {None}


def test_pruning_keeps_the_newest_tags_only():
    names = ["step0000002", "step0000010", "step0000001", "latest", "zero_to_fp32.py", "step0000003"]
    assert tags_to_prune(names, 2) == ["step0000001", "step0000002"]
    assert tags_to_prune(names, 0) == [] and tags_to_prune(names, 9) == []


def test_offload_switches_reach_deepspeed_and_are_checked():
    cfg = LearnerConfig(zero_stage=3, offload_optimizer=True, offload_param=True)
    zero = deepspeed_config(cfg, 4, "float32", 1)["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert "offload_param" not in deepspeed_config(LearnerConfig(zero_stage=2), 1, "float32", 1)["zero_optimization"]
    with pytest.raises(ValueError, match="offload_param"):
        LearnerConfig(zero_stage=2, offload_param=True)
    with pytest.raises(ValueError, match="weight_bucket_mb"):
        LearnerConfig(weight_bucket_mb=0)


def test_one_rank_runs_zero_stage_0_unless_it_offloads_or_partitions_parameters():
    def stage(world_size, **kw):
        return deepspeed_config(LearnerConfig(**kw), 1, "float32", world_size)["zero_optimization"]["stage"]

    assert stage(1, zero_stage=2) == 0 and stage(1, zero_stage=1) == 0  # nothing to partition over one rank
    assert stage(2, zero_stage=2) == 2 and stage(4, zero_stage=1) == 1
    assert stage(1, zero_stage=3) == 3  # partitioned loading stays
    assert stage(1, zero_stage=2, offload_optimizer=True) == 2  # offload needs ZeRO


def test_weight_buckets_hold_consecutive_parameters_up_to_the_size():
    import torch

    from learner.weight_broadcast import weight_buckets

    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate([100, 100, 300, 50, 10, 400])]
    buckets = weight_buckets(params, bucket_bytes=200 * 4)
    assert [[n for n, _ in b] for b in buckets] == [
        ["p0", "p1"],
        ["p2"],
        ["p3", "p4"],
        ["p5"],
    ]  # p2, p5: over the size, alone
    assert [n for b in buckets for n, _ in b] == [n for n, _ in params]


def test_bucket_bounds_split_in_order_and_a_large_item_goes_alone():
    from weights.buckets import bucket_bounds

    assert bucket_bounds([100, 100, 300, 50, 10, 400], 200) == [range(0, 2), range(2, 3), range(3, 5), range(5, 6)]
    assert bucket_bounds([500], 200) == [range(0, 1)] and bucket_bounds([], 200) == []
    assert bucket_bounds([200, 0, 1], 200) == [
        range(0, 2),
        range(2, 3),
    ]  # a full bucket still takes an item of no bytes
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_bounds([1], 0)


def test_weight_buckets_count_the_wider_of_trained_and_sent_element():
    import torch

    from learner.weight_broadcast import weight_buckets

    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(100, dtype=torch.bfloat16))) for i in range(4)]
    assert len(weight_buckets(params, bucket_bytes=400)) == 2  # bf16: 200 bytes each
    assert len(weight_buckets(params, bucket_bytes=400, element_size=4)) == 4  # sent as fp32: 400 each


def test_weight_manifest_is_checked_and_describes_itself():
    from weights.buckets import WeightManifest

    m = WeightManifest(["a", "b"], [3 << 20, 1 << 20], "bfloat16", 5, 2 << 20, 2.0)
    assert m.total_bytes == 4 << 20 and m.buckets == ("a", "b")
    assert "5 tensors, 4.0 MiB bfloat16 in 2 buckets (largest 3.00 MiB" in m.describe()
    with pytest.raises(ValueError, match="at least one bucket"):
        WeightManifest((), (), "float32", 0, 0, 1.0)
    with pytest.raises(ValueError, match="2 buckets but 1 sizes"):
        WeightManifest(("a", "b"), (1,), "float32", 2, 1, 1.0)


def test_recomputation_is_chosen_per_micro_batch_from_its_length_on_one_rank():
    from learner.rank_shards import agree_on_recompute

    assert agree_on_recompute([[30, 2], [5]], 3, 1) == [[True, False], [True]]
    assert agree_on_recompute([[30, 2], []], 0, 1) == [[True, True], []]  # 0: always, nothing to agree on


def _recompute_in_group(rank: int, port: int, forwarded, out) -> None:
    import torch.distributed as dist

    from learner.rank_shards import agree_on_recompute

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, agree_on_recompute(forwarded, 3, 2)))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_recomputation_from_the_longest_micro_batch_at_each_place():
    """Issue 38 item 8: each rank chose from its own micro-batch's length, so a rank with a 2-token
    padding micro-batch skipped the recompute its peer ran, and the ZeRO-3 group died at step 1."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    shares = [[[30, 30], [2]], [[30, 2], [2]]]  # rank 1's second micro-batch is padding
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_recompute_in_group, args=(r, port, shares[r], out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got[0] == got[1] == [[True, True], [False]]


def test_a_rank_of_padding_alone_reports_zero_loss_terms():
    """One group over two ranks: rank 1 runs padding micro-batches only, which add no loss metrics;
    its step result must still build (LearnerStepResult's loss terms were missing: the run died at step 1)."""
    from learner.step_result import LearnerStepResult
    from learner.step_stats import StepStats

    stats = StepStats(policy_version=0)
    stats.start_mini()
    stats.grad_norm(0.5)
    got = stats.result()
    assert {got[k] for k in ("loss", "pg_loss", "clip_frac", "ratio_mean")} == {0.0} and "kl" not in got
    LearnerStepResult(
        step=1,
        seconds=1.0,
        learner_world_size=2,
        samples_per_s=0.0,
        tokens_per_s=0.0,
        sequence_tokens=0,
        forward_tokens=0,
        scored_tokens=0,
        groups=0,
        zero_variance_groups=0,
        mean_scale=1.0,
        reward_mean=0.0,
        mini_batches=1,
        **got,
    )
