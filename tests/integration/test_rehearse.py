"""`seal rehearse recipe=qwen3b_1x4`: the smallest GPU recipe's topology on this CPU machine (one node
of 4 logical GPUs: 2 learner ranks under ZeRO-3, one vLLM replica of TP 2 on the CPU backend, the
learner's weight group over gloo, async, a checkpoint each step, a snapshot), 2 steps, tiny model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


def test_rehearsal_of_the_smallest_gpu_recipe(tmp_path: Path, seal_bin):
    run_dir = tmp_path / "rehearse"
    done = subprocess.run(
        [
            *seal_bin,
            "rehearse",
            "--json",
            "--steps",
            "2",
            "--timeout",
            "780",
            "recipe=qwen3b_1x4",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["failures"] == []
    assert json.loads((run_dir / "rehearsal.json").read_text())["ok"]
    assert (run_dir / "rehearsal.txt").read_text().rstrip().endswith("rehearsal: passed")
    # Placement: one node holding both ranks and the replica, as `seal plan recipe=qwen3b_1x4` states.
    nodes = report["cluster"]["nodes"]
    assert len(nodes) == 1 and nodes[0]["GPU"] == 4
    assert report["plan"] == [{"name": "node 0", "learner": 2, "generator": 1}]
    landed = {(x["role"], x["node_id"], x["gpus"]) for x in report["landings"]}
    assert landed == {("learner", nodes[0]["node_id"], 1), ("generator", nodes[0]["node_id"], 2)}
    assert [x["name"] for x in report["landings"] if x["role"] == "learner"] == ["rank 0", "rank 1"]
    # Groups: the ZeRO-3 training group over 2 ranks (each holds half the model), the weight group of 1 + 1 x TP 2.
    training, weight = report["groups"]
    assert training["world_size"] == 2 and "rank 0 holds 50%" in training["detail"]
    assert weight["world_size"] == 3 and "ranks [1, 2]" in weight["detail"]
    # Every version confirmed by the replica, its canary within fp32 rounding of the learner's.
    (versions,) = report["weights"].values()
    assert [v["version"] for v in versions] == [1, 2] and all(v["confirmed"] for v in versions)
    assert all(v["canary_diff"] is not None and v["canary_diff"] < 1e-3 for v in versions)
    # A checkpoint every step, every rank's shard in the newest; the closing snapshot's weights.
    ck = report["checkpoints"]
    assert ck["tag"] == "step0000002" and ck["tags"] == ["step0000001", "step0000002"]
    assert all(any("zero_pp_rank_" in f["file"] for f in ck["ranks"][r]) for r in ("0", "1"))
    assert report["snapshot"]["step"] == 2 and report["snapshot"]["files"] > 0
    assert [s["step"] for s in report["steps"]] == [1, 2]
    assert report["not_rehearsed"] and any("NCCL" in x for x in report["not_rehearsed"])


@pytest.mark.slow  # a rehearsal: 3 min 35 s on 2 cores under other engineers' load (2026-12-07)
def test_rehearsal_of_the_one_gpu_lora_recipe(tmp_path: Path, seal_bin):
    """`seal rehearse recipe=qwen7b_lora_1x1`: one logical GPU shared by the learner rank and the replica
    (half each), a LoRA adapter published through the object store, ZeRO-2 on one rank (DeepSpeed's
    stage 0: the optimizer state sits in the rank's model states file, no ZeRO shard)."""
    run_dir = tmp_path / "rehearse"
    done = subprocess.run(
        [*seal_bin, "rehearse", "--json", "--timeout", "780", "recipe=qwen7b_lora_1x1", f"run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["failures"] == []
    (node,) = report["cluster"]["nodes"]
    assert node["GPU"] == 1 and report["plan"] == [{"name": "node 0", "learner": 1, "generator": 1}]
    landed = {(x["role"], x["node_id"], x["gpus"]) for x in report["landings"]}
    assert landed == {("learner", node["node_id"], 0.5), ("generator", node["node_id"], 0.5)}
    (training,) = report["groups"]  # no weight group: the adapter goes through the object store
    assert training["world_size"] == 1
    (versions,) = report["weights"].values()
    assert [v["version"] for v in versions] == [1, 2] and all(v["confirmed"] for v in versions)
    assert any("mp_rank_00_model_states" in f["file"] for f in report["checkpoints"]["ranks"]["0"])
    assert report["snapshot"]["step"] == 2 and report["snapshot"]["files"] > 0
