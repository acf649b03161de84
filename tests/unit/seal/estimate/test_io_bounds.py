"""Checkpoint, resume and snapshot are bounded by their bytes (seal/estimate/io_bounds.py), shown by
`seal plan` and given to the learner group (issue 38 item 7: all three shared learner.timeout_s,
600 s, against ~91 GB of 7B checkpoint I/O)."""

from __future__ import annotations

import argparse
import json

import pytest

from seal.config import LearnerGroupConfig, compose
from seal.estimate.io_bounds import IoBounds, checkpoint_bytes, io_bounds, snapshot_bytes
from seal.estimate.memory import LearnerSetup
from seal.estimate.plan import build_plan, run_io_bounds
from seal.runtime.learner_group import LearnerGroup
from tests.unit.seal.estimate.test_plan import P7, QWEN7

ZERO3 = LearnerSetup(backend="deepspeed", zero_stage=3, world_size=8)


def test_the_bytes_are_the_state_a_checkpoint_holds():
    # fp32 weights 4P + AdamW m and v 8P; ZeRO-1/2 also write their fp32 master partition; SGD keeps no state.
    assert checkpoint_bytes(QWEN7, ZERO3) == 12 * P7 == pytest.approx(91.4e9, rel=1e-3)
    assert checkpoint_bytes(QWEN7, LearnerSetup(zero_stage=2, world_size=2)) == 16 * P7
    assert checkpoint_bytes(QWEN7, LearnerSetup(zero_stage=3, offload_optimizer=True)) == 16 * P7
    assert checkpoint_bytes(QWEN7, LearnerSetup(backend="torch", optimizer="sgd")) == 4 * P7
    assert snapshot_bytes(QWEN7) == 4 * P7


def test_each_bound_is_the_control_timeout_plus_its_bytes_at_the_slowest_storage():
    b = io_bounds(QWEN7, ZERO3, 600.0, 100.0)
    assert b.checkpoint_s == pytest.approx(600 + 12 * P7 / 100e6)  # 600 + 914 s: past the 600 s all three had
    assert b.snapshot_s == pytest.approx(600 + 4 * P7 / 100e6)
    assert b.checkpoint_s > 1500 and io_bounds(QWEN7, ZERO3, 600.0, 1000.0).checkpoint_s < 700
    assert "checkpoint 91.4 GB (a resume reads it): 1514 s; snapshot 30.5 GB: 905 s" in b.describe()
    with pytest.raises(ValueError, match="storage_min_mb_s"):
        IoBounds(1.0, 1.0, 600.0, 0.0)


def test_seal_plan_shows_the_bounds(capsys):
    from seal.commands.plan import run

    plan = build_plan(compose(["recipe=qwen7b_1x8"]), query=False)
    assert plan.io is not None and plan.io.checkpoint_bytes == checkpoint_bytes(QWEN7, plan.learner)
    run(argparse.Namespace(overrides=["recipe=qwen7b_1x8", "trainer.storage_min_mb_s=500"], json=False))
    table = capsys.readouterr().out
    assert "storage bounds: checkpoint 91.4 GB (a resume reads it): 783 s; snapshot 30.5 GB: 661 s" in table
    run(argparse.Namespace(overrides=["recipe=qwen7b_1x8"], json=True))
    got = json.loads(capsys.readouterr().out)["io_bounds"]
    assert got["checkpoint_gb"] == pytest.approx(91.4, abs=0.05) and got["storage_min_mb_s"] == 100


def test_the_run_gives_the_learner_group_the_bounds_and_its_calls_use_them(monkeypatch):
    io = run_io_bounds(compose([]))  # the CPU default (the embedded model): what actor_set.py passes on
    assert io is not None and io.base_s == 600.0 and io.min_mb_s == 100.0
    group = LearnerGroup.__new__(LearnerGroup)  # its calls, without Ray
    group.settings = LearnerGroupConfig.of(compose(["learner.world_size=2"]))
    group.io = IoBounds(checkpoint_bytes=4400e6, snapshot_bytes=300e6, base_s=600.0, min_mb_s=1.0)
    assert (group.checkpoint_timeout_s, group.snapshot_timeout_s) == (5000.0, 900.0)
    assert group.wait_s == 5000.0  # a call queued behind a checkpoint waits it out on the rank
    asked: dict[str, float | None] = {}
    monkeypatch.setattr(
        group, "_all", lambda method, what, args, timeout_s=None: asked.update({what: timeout_s}) or ["x"]
    )
    group.save_checkpoint("/ckpt", {}, keep=2)
    group.load_checkpoint("/ckpt")
    group.save_snapshot("/snap", 3)
    assert asked == {"checkpoint": 5000.0, "resume": 5000.0, "snapshot": 900.0}


def test_a_zero2_checkpoint_whose_closing_barrier_outlasts_the_group_timeout_is_refused():
    """Issue 46 item 10: under ZeRO-1/2 on several ranks rank 0 alone writes the fp32 weights (4P) at a
    checkpoint while the others wait in DeepSpeed's closing barrier, a collective bounded by the training
    group's timeout (learner.timeout_s), which the checkpoint's own bound does not stretch."""
    from seal.estimate.io_bounds import closing_barrier_problem, closing_barrier_s
    from seal.estimate.plan import check_fits

    z2 = LearnerSetup(zero_stage=2, world_size=8)
    assert closing_barrier_s(QWEN7, z2, 40.0) == pytest.approx(4 * P7 / 40e6) == pytest.approx(762, abs=1)
    assert 4 * P7 / 600 / 1e6 == pytest.approx(50.8, abs=0.1)  # the storage below which a 7B's ranks are torn down
    line = closing_barrier_problem(QWEN7, z2, 600.0, 40.0)
    assert line is not None and "rank 0 alone writes the 30.5 GB of fp32 weights" in line
    assert "762 s at trainer.storage_min_mb_s=40 MB/s" in line and "set learner.timeout_s=800" in line
    assert closing_barrier_problem(QWEN7, z2, 600.0, 60.0) is None  # 508 s: within the 600 s
    assert closing_barrier_problem(QWEN7, z2, 800.0, 40.0) is None
    for every_rank_alike in (ZERO3, LearnerSetup(zero_stage=2, world_size=1), LearnerSetup(backend="torch")):
        assert closing_barrier_s(QWEN7, every_rank_alike, 1.0) == 0.0
    slow = ["recipe=qwen7b_1x8", "learner=zero2", "trainer.storage_min_mb_s=40", "trainer.checkpoint_every=5"]
    plan = build_plan(compose(slow), query=False)
    assert any("closing barrier" in p for p in plan.problems)
    with pytest.raises(ValueError, match="DeepSpeed's closing barrier, 762 s"):
        check_fits(compose(slow))
    for fine in (["trainer.checkpoint_every=0"], ["learner.timeout_s=800"], ["learner=zero3"]):
        plan = build_plan(compose([*slow, *fine]), query=False)
        assert not any("closing barrier" in p for p in plan.problems), fine
