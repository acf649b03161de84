"""The collective groups against their members' devices (seal/estimate/device_groups.py), refused in
one line by `seal plan` and by `seal train`'s preflight (issue 38 item 3: such configurations passed
every check and failed late, in the replica's join of the weight group or in NCCL's init)."""

from __future__ import annotations

import argparse

import pytest

from seal.config import Settings, compose, instantiate
from seal.errors import CliError
from seal.estimate.device_groups import group_problems
from seal.estimate.plan import build_plan, check_fits

ONE_GPU = "cluster.hardware={nodes:1,gpus_per_node:1,gpu_gb:80,cpus_per_node:16,memory_gb:128}"
CUDA_REPLICA_CPU_LEARNER = ["generator=vllm_async_gpu", "cluster.generator.num_gpus=1", ONE_GPU]
TWO_RANKS_ONE_GPU = ["learner=zero3", "learner.world_size=2", "learner.cfg.device=cuda", "cluster.learner.num_gpus=0.5"]
LEARNER_AND_REPLICA_ONE_GPU = [
    "generator=vllm_async_gpu",
    "learner.cfg.device=cuda",
    "cluster.learner.num_gpus=0.5",
    "cluster.generator.num_gpus=0.5",
    ONE_GPU,
]


def problems(overrides: list[str]) -> list[str]:
    cfg = compose(overrides)
    return group_problems(Settings.of(cfg), instantiate(cfg.cluster))


def refused_by_plan_and_preflight(overrides: list[str], match: str) -> None:
    """`seal plan` ends on a verdict naming it; the preflight's plan check raises it, in one line."""
    from seal.commands.plan import run

    with pytest.raises(CliError, match=match) as plan_error:
        run(argparse.Namespace(overrides=overrides, json=True))
    with pytest.raises(ValueError, match=match) as preflight_error:
        check_fits(compose(overrides))
    for exc in (plan_error.value, preflight_error.value):
        assert "\n" not in str(exc)


def test_a_cuda_replica_broadcasting_to_a_cpu_learner_is_refused(capsys):
    line = (
        "generator.weight_sync=broadcast puts learner rank 0 (learner.cfg.device=cpu) and the generator's workers "
        "(generator.device=cuda) in one gloo weight group, which serves the CPU at both ends: set "
        "learner.cfg.device=cuda, or generator.weight_sync=reload"
    )
    # Everything else fits one GPU: this was the whole plan's verdict, and it said "fits".
    assert build_plan(compose(CUDA_REPLICA_CPU_LEARNER), query=False).problems == [line]
    refused_by_plan_and_preflight(CUDA_REPLICA_CPU_LEARNER, "generator.weight_sync=broadcast puts learner rank 0")
    # The other way round: a CUDA learner's NCCL group asked of a replica on the CPU.
    (other,) = problems(["generator.weight_sync=broadcast", "learner.cfg.device=cuda", "cluster.learner.num_gpus=1"])
    assert "(learner.cfg.device=cuda)" in other and "one nccl weight group, which serves CUDA at both ends" in other


def test_two_learner_ranks_on_one_gpu_are_refused(capsys):
    overrides = TWO_RANKS_ONE_GPU + [ONE_GPU]
    (line,) = build_plan(compose(overrides), query=False).problems  # the one problem of a plan that "fit"
    assert line.startswith("learner.world_size=2 CUDA ranks with cluster.learner.num_gpus=0.5 each: Ray may put")
    refused_by_plan_and_preflight(overrides, "learner.world_size=2 CUDA ranks with cluster.learner.num_gpus=0.5")


def test_a_learner_and_a_replica_on_one_gpu_in_the_nccl_weight_group_are_refused(capsys):
    # seal plan also says a replica needs tensor_parallel_size GPUs; the preflight's line is the group's.
    refused_by_plan_and_preflight(
        LEARNER_AND_REPLICA_ONE_GPU,
        r"the NCCL weight group's members learner rank 0 \(cluster.learner.num_gpus=0.5\) and 1 generator worker",
    )
    with pytest.raises(ValueError, match=r"^the NCCL weight group's members"):
        check_fits(compose(LEARNER_AND_REPLICA_ONE_GPU))


def test_two_replica_workers_on_fractions_share_as_well():
    (line,) = problems(
        ["generator=vllm_async_gpu", "learner.cfg.device=cuda", "cluster.learner.num_gpus=1"]
        + [
            "generator.replicas=2",
            "cluster.generator.num_gpus=0.5",
        ]
    )
    assert "members 2 generator worker(s) (0.5 GPUs over tensor_parallel_size=1) hold fractions" in line


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the CPU default: gloo throughout
        ["generator=vllm_gpu"],  # reload: no weight group, the devices may differ
        [
            "generator=vllm_async_gpu",
            "learner.cfg.device=cuda",
            "cluster.learner.num_gpus=1",
            "cluster.generator.num_gpus=1",
        ],
        # One member on a fraction, the other on a whole GPU Ray gives nobody else: they cannot meet.
        [
            "generator=vllm_async_gpu",
            "learner.cfg.device=cuda",
            "cluster.learner.num_gpus=0.5",
            "cluster.generator.num_gpus=1",
        ],
        TWO_RANKS_ONE_GPU[:-1] + ["cluster.learner.num_gpus=1"],
        ["recipe=qwen7b_2x8"],
        ["recipe=qwen3b_1x4"],
    ],
)
def test_groups_whose_members_can_form_them_pass(overrides):
    assert problems(overrides) == []
