"""Frozen snapshots of a run (SEAGym): A_0 is the initial model; later ones
are taken every ``trainer.snapshot_every`` learner steps and at the end of
each `seal train` invocation.

    RUN_DIR/snapshots/index.jsonl   one record per snapshot, in order
    RUN_DIR/snapshots/<name>/       weights/ (a loadable HF model dir; absent for
                                    A_0, which points at the base model),
                                    interface.json, capability.json, metrics.json

A record: {"name", "step", "policy_version", "interface_version", "weights"
(a model directory relative to RUN_DIR, or the base model's name for A_0:
``snapshot_weights`` resolves either), "wall_s" (training
wall time so far), "update_tokens" and "rollout_tokens" (cumulative)}. The last
record is the final snapshot. Evaluation reads these and never writes training state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INDEX = "index.jsonl"


def snapshot_root(run_dir: Path) -> Path:
    return Path(run_dir) / "snapshots"


def read_snapshots(run_dir: Path) -> list[dict[str, Any]]:
    index = snapshot_root(run_dir) / INDEX
    if not index.is_file():
        raise FileNotFoundError(f"no snapshots in {run_dir} (no snapshots/{INDEX}; was it written by `seal train`?)")
    return [json.loads(line) for line in index.read_text().splitlines() if line.strip()]


def write_snapshot(
    run_dir: Path,
    record: Mapping[str, Any],
    interface: Mapping[str, Any],
    capability: Mapping[str, Any],
    metrics: Mapping[str, Any] | None,
) -> Path:
    """Write the side files and append the record (the index line goes last,
    so a crash mid-write never indexes a half snapshot)."""
    root = snapshot_root(run_dir)
    path = root / record["name"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "interface.json").write_text(json.dumps(interface, indent=2))
    (path / "capability.json").write_text(json.dumps(capability))
    (path / "metrics.json").write_text(json.dumps(metrics or {}, indent=2))
    with open(root / INDEX, "a") as f:
        f.write(json.dumps(dict(record)) + "\n")
    return path


def next_name(run_dir: Path) -> str:
    try:
        return f"A_{len(read_snapshots(run_dir))}"
    except FileNotFoundError:
        return "A_0"


def snapshot_weights(run_dir: Path, record: Mapping[str, Any]) -> str:
    """What to load for a snapshot: a directory inside the run, or the base model's name."""
    path = Path(run_dir) / record["weights"]
    return str(path) if record["name"] != "A_0" else str(record["weights"])
