"""`seal rehearse`'s judgement without a cluster: the placement against `seal plan`, the checkpoint
shards per rank, the overrides it runs `seal train` with, and the refusals before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from seal.commands.rehearse_report import (
    Landing,
    NodeShape,
    Report,
    checkpoint_problems,
    checkpoint_shards,
    compare_placement,
    file_rank,
    report_text,
)

PLAN_2X8 = [NodeShape(learners=0, generators=2), NodeShape(learners=8, generators=0)]  # seal plan recipe=qwen7b_2x8
NODES = ["aaaaaaaa11", "bbbbbbbb22"]


def _landings(learner_nodes: list[str], replica_nodes: list[str]) -> list[Landing]:
    return [Landing("learner", f"rank {r}", n, "10.0.0.1", 1) for r, n in enumerate(learner_nodes)] + [
        Landing("generator", f"seal-x-generator-{i}", n, "10.0.0.1", 4) for i, n in enumerate(replica_nodes)
    ]


def test_the_plans_layout_passes_on_either_node():
    assert compare_placement(PLAN_2X8, _landings([NODES[1]] * 8, [NODES[0]] * 2), NODES) == []
    assert compare_placement(PLAN_2X8, _landings([NODES[0]] * 8, [NODES[1]] * 2), NODES) == []


def test_a_learner_split_over_nodes_fails_with_one_line_naming_it():
    # What placing the replicas first (one per node) leaves the learner's PACK group: 4 + 4 ranks.
    problems = compare_placement(PLAN_2X8, _landings([NODES[0]] * 4 + [NODES[1]] * 4, NODES), NODES)
    assert len(problems) >= 1
    first = problems[0]
    assert "\n" not in first
    assert first.startswith("learner split over 2 nodes (4 + 4 ranks") and "places it on 1 (8)" in first
    assert "ranks 0,1,2,3 on node aaaaaaaa" in first and "ranks 4,5,6,7 on node bbbbbbbb" in first
    assert any(p.startswith("generator replicas per node 1 + 1 where seal plan places 2") for p in problems)
    report = Report(
        "qwen7b_2x8", "seal train ...", {"nodes": [{"node_id": n, "ip": "10.0.0.1"} for n in NODES]}, failures=problems
    )
    assert not report.ok and "\n" not in report.verdict()
    assert report.verdict().startswith("rehearsal of qwen7b_2x8 failed: learner split over 2 nodes")


def test_missing_ranks_and_other_shapes_are_named():
    one_node = [NodeShape(2, 1)]
    assert compare_placement(one_node, _landings(["n0"], ["n0"]), ["n0"]) == [
        "1 learner ranks placed where seal plan places 2"
    ]
    # Same counts, other co-location: 1 learner + replica | 1 learner, where the plan has both ranks with the replica.
    shapes = compare_placement([NodeShape(2, 1), NodeShape(0, 0)], _landings(["n0", "n1"], ["n0"]), ["n0", "n1"])
    assert shapes and shapes[0].startswith("learner split over 2 nodes")


def test_checkpoint_shards_per_rank(tmp_path: Path):
    ckpt = tmp_path / "latest"
    for tag in ("step0000001", "step0000002"):
        (ckpt / tag).mkdir(parents=True)
    for r in range(2):
        (ckpt / "step0000002" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"x" * 10)
    (ckpt / "step0000001" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
    (ckpt / "rng.pt").write_bytes(b"r")
    (ckpt / "learner.json").write_text("{}")
    shards = checkpoint_shards(ckpt)
    assert shards["tag"] == "step0000002" and list(shards["ranks"]) == ["0", "1"]
    assert [Path(f["file"]).name for f in shards["ranks"]["0"]] == [
        "rng.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    ]
    assert checkpoint_problems(shards, world_size=2, deepspeed=True) == []
    # A third rank that wrote nothing is named.
    assert checkpoint_problems(shards, world_size=3, deepspeed=True) == [
        f"learner rank 2 wrote no checkpoint shard under {ckpt}"
    ]
    # One rank at DeepSpeed's stage 0 (ZeRO-2 on one rank: qwen7b_lora_1x1) writes no ZeRO shard: its
    # model states file holds the optimizer state.
    single = tmp_path / "single"
    (single / "step0000001").mkdir(parents=True)
    (single / "step0000001" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    one = checkpoint_shards(single)
    assert checkpoint_problems(one, world_size=1, deepspeed=True, zero_shards=False) == []
    assert checkpoint_problems(one, world_size=1, deepspeed=True) == [
        f"learner rank 0 wrote no checkpoint shard under {single}"
    ]
    assert (
        file_rank("rng_rank3.pt"),
        file_rank("bf16_zero_pp_rank_5_mp_rank_00_optim_states.pt"),
        file_rank("latest"),
    ) == (3, 5, None)


def test_report_text_states_the_failure_last():
    report = Report(
        "qwen3b_1x4",
        "seal train recipe=qwen3b_1x4",
        {"kind": "x", "nodes": [{"node_id": "n0", "ip": "1.2.3.4"}]},
        plan=[{"name": "node 0", "learner": 2, "generator": 1}],
        landings=_landings(["n0", "n0"], ["n0"]),
        failures=["learner rank 1 on node 1.2.3.4 died during train step at step 2: SIGABRT"],
    )
    text = report_text(report)
    assert "node 0 (n0, 1.2.3.4): learner rank 0 (1 GPU), learner rank 1 (1 GPU), replica 0 (4 GPUs)" in text
    assert "seal plan: node 0: learner x2 + generator x1" in text
    assert text.splitlines()[-2:] == [
        "rehearsal: FAILED",
        "  learner rank 1 on node 1.2.3.4 died during train step at step 2: SIGABRT",
    ]


def test_overrides_keep_the_recipes_topology_and_compose():
    from seal.commands.preflight import preflight
    from seal.commands.rehearse import rehearsal_overrides, user_address
    from seal.config import Settings, compose

    target = Settings.of(compose(["recipe=qwen7b_2x8"]))
    # Preflight knocks on the cluster's address: a listening socket here stands in for the rehearsal's Ray head.
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        overrides = rehearsal_overrides(target, ["recipe=qwen7b_2x8"], address, "/tmp/unused", 2, "tiny", local=True)
        cfg, _ = preflight(overrides)  # every check `seal train` makes before it starts
    g = cfg.generator
    assert (g.tensor_parallel_size, g.replicas, g.weight_sync, g.update_mode, g.device) == (
        4,
        2,
        "broadcast",
        "keep",
        "cpu",
    )
    assert (cfg.learner.world_size, cfg.learner.cfg.zero_stage, cfg.learner.cfg.device) == (8, 3, "cpu")
    assert (cfg.cluster.learner.num_gpus, cfg.cluster.generator.num_gpus, cfg.cluster.hardware.nodes) == (1, 4, 2)
    assert (cfg.trainer.mode, cfg.trainer.checkpoint_every, cfg.cluster.ray_auth) == ("async", 1, "disabled")
    assert (
        user_address(["recipe=qwen7b_2x8"]) is None
        and user_address(["cluster.address=10.0.0.1:6379"]) == "10.0.0.1:6379"
    )


def test_a_recipe_the_nodes_cannot_hold_fails_before_anything_starts(tmp_path, capsys):
    from seal.commands.cli import main

    # A TP-2 replica and 2 learner GPUs on nodes of 3 GPUs: the plan places the replica first, a rank has no GPU.
    rc = main(["rehearse", "recipe=qwen3b_1x4", "cluster.hardware.gpus_per_node=3", f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("seal: error: rehearsal of qwen3b_1x4 failed: seal plan cannot place the recipe:")
    assert (
        "1 of 2 learner actors of 4 CPU, 1 GPU each cannot be placed" in err[0]
        and (tmp_path / "r" / "rehearsal.json").is_file()
    )


def test_rehearse_needs_nodes(capsys):
    from seal.commands.cli import main

    assert main(["rehearse", "env=toy", "model=tiny"]) == 2
    assert "cluster.hardware" in capsys.readouterr().err


@pytest.mark.parametrize("tp, model", [(1, "tiny"), (2, "tiny")])
def test_the_bundled_tiny_model_serves_tp_up_to_its_heads(tp, model):
    from seal.commands.rehearse import rehearsal_model

    assert rehearsal_model(tp) == model


def test_a_crash_is_one_line_and_memory_kills_say_whose_limit_they_are():
    from seal.commands.rehearse import failure_line
    from seal.runtime.learner_group import LearnerGroupError

    died = LearnerGroupError("learner rank 1 on node 10.0.0.1 (vm) died during train step at step 2: SIGABRT")
    assert failure_line(died) == str(died)
    # Ray's memory monitor killing a rank (the message LearnerGroup keeps: the last line of Ray's).
    oom = LearnerGroupError(
        "learner rank 7 on node 10.0.0.1 (vm) failed during train step at step 2: Refer to the documentation "
        "on how to address the out of memory issue: https://docs.ray.io/en/latest/... Consider provisioning"
    )
    line = failure_line(oom)
    assert line.startswith(
        "learner rank 7 on node 10.0.0.1 (vm) failed during train step at step 2: killed by Ray's memory monitor"
    )
    assert "not of the topology" in line and "docs.ray.io" not in line
    # A rank that died (finding 2's gloo abort, as the rehearsal of qwen3b_1x4 met it on the old code): Ray's facts, not its guesses.
    dead = LearnerGroupError(
        "learner rank 1 on node 10.0.0.1 (vm) died during train step at step 2: The actor is dead because its worker "
        "process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of file. Some common causes include: (1) the process was killed by the OOM"
    )
    line = failure_line(dead)
    assert (
        "connection error code 2. End of file. (its stack: worker-*.err under the report's Ray logs)" in line
        and "common causes" not in line
    )
