"""`seal train ... learner.cfg.lora.rank=8` on the tiny model: two steps through the whole pipeline
(Ray, the async vLLM generator, the learner, publishes with the canary), a checkpoint holding only the
adapter and its optimizer state, a snapshot the evaluators load as a plain model, and a resumed step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "env=toy",
    "model=tiny",
    "learner=torch",
    "learner.cfg.lora.rank=8",
    "n=2",
    "trainer.oversample=0",
    "trainer.filter_groups=none",
    "sampling.max_new_tokens=16",
    "cluster.env_actors=1",
    "evaluation.final=false",
]


def seal_train(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "seal.commands.cli", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=840, cwd=REPO, env=dict(os.environ))


@pytest.mark.slow
def test_a_lora_run_trains_publishes_checkpoints_and_resumes(tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    proc = seal_train(*ARGS, "trainer.steps=2", "trainer.checkpoint_every=1", f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["policy_version"] == 2
    assert all(r["weight_sync_canary_failures"] == 0 for r in rows)

    state = torch.load(run_dir / "checkpoints" / "latest" / "torch_state.pt", weights_only=False)
    assert state["model"] and all(".lora_" in name for name in state["model"])  # the adapter only
    snapshot = json.loads((run_dir / "snapshots" / "index.jsonl").read_text().splitlines()[-1])
    model = AutoModelForCausalLM.from_pretrained(str(run_dir / snapshot["weights"]), dtype=torch.float32)
    assert not any("lora_" in name or "base_layer" in name for name, _ in model.named_parameters())

    proc = seal_train("trainer.steps=1", f"resume={run_dir}")  # the run's own config, LoRA included
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-1] == 3


@pytest.mark.slow
def test_a_lora_run_takes_its_kl_reference_from_the_replicas(tmp_path):
    """trainer.reference_logprobs=generator: the replica that played each group scores it on the base,
    the trajectories carry that over ZeroMQ, and the learner takes it for every scored token instead
    of its own reference forward; the KL it reports is the same small one as with its own."""
    run_dir = tmp_path / "run"
    proc = seal_train(*ARGS, "trainer.steps=2", "trainer.reference_logprobs=generator", f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reference_carried_tokens"] == r["learner_scored_tokens"] > 0, r
        assert r["wait_s"]["reference"] > 0 and 0 <= r["kl"] < 0.05
