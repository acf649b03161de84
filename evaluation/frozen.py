"""The main job's closing evaluation: frozen snapshots (A_0, the final one and, with
``evaluation.final_snapshots: all``, every one between: the learning curve) on the
same tasks of the env's test split, under the raw benchmark interface, greedy, one
rollout per task, every task of a snapshot played together (one engine batch per
generation step). Results go to RUN_DIR/evaluation/final.json (the before/after rows
of evaluation/before_after.py) and final_tasks.jsonl (one line per task and snapshot).

The opening prompt is part of the benchmark's definition: every snapshot must see
the same one, token for token, so each snapshot's rendered prompt of the first task is
hashed and a mismatch is an error, not a footnote.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_pool.interface.state import RAW_INTERFACE
from evaluation.before_after import HELD_IN_ALL, Rate, before_after_rows, row_record
from evaluation.catalog import task_category
from evaluation.curves import held_in, in_category, rate_record
from rollout.play import run_episodes

FINAL_FILE, FINAL_TASKS_FILE = "final.json", "final_tasks.jsonl"


@dataclass(frozen=True)
class FinalTasks:
    task_ids: tuple[str, ...]
    held_out: tuple[str, ...]  # categories never trained on
    categories: Mapping[str, str]  # task id -> category


def final_tasks(
    test_ids: Sequence[str], heldout_categories: Sequence[str], per_category: int | None = None
) -> FinalTasks:
    """The test split's tasks, the first ``per_category`` of each category (None: all)."""
    taken: dict[str, int] = {}
    keep, categories = [], {}
    for t in test_ids:
        c = task_category(t)
        if per_category is not None and taken.get(c, 0) >= per_category:
            continue
        taken[c] = taken.get(c, 0) + 1
        keep.append(t)
        categories[t] = c
    if not keep:
        raise ValueError("the test split is empty: nothing to evaluate")
    return FinalTasks(tuple(keep), tuple(c for c in heldout_categories if c in taken), categories)


def opening_prompt(make_env: Callable[[], Any], chat: Any, task_id: str) -> list[int]:
    """The token ids a snapshot sees first on ``task_id`` under the raw interface."""
    return list(chat.prompt_ids(make_env().reset(task_id, RAW_INTERFACE)))


def prompt_digest(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SnapshotRun:
    name: str
    results: Mapping[str, tuple[str, bool]]  # task id -> (category, success)
    prompt_digest: str
    wall_s: float
    generated_tokens: int
    rewards: Mapping[str, float] = field(default_factory=dict)  # task id -> reward (partial credit: below 1)


def play_snapshot(
    name: str,
    make_env: Callable[[], Any],
    generator: Any,
    chat: Any,
    tasks: FinalTasks,
    sampling: Any,
    seed: int,
    details: Path | None = None,
) -> SnapshotRun:
    """Every task once on the generator's current weights, raw interface, played together."""
    if sampling.temperature != 0.0:
        raise ValueError(f"the closing evaluation is greedy; got temperature {sampling.temperature}")
    digest = prompt_digest(opening_prompt(make_env, chat, tasks.task_ids[0]))
    t0 = time.perf_counter()
    trajectories = run_episodes(
        make_env, generator, chat, list(tasks.task_ids), sampling, RAW_INTERFACE, group_id=f"final-{name}", seed=seed
    )
    wall = time.perf_counter() - t0
    results, rewards = {}, {}
    for traj in trajectories:
        if tasks.categories[traj.task_id] != traj.category:
            raise ValueError(
                f"task {traj.task_id}: the env says {traj.category!r}, the task id {tasks.categories[traj.task_id]!r}"
            )
        results[traj.task_id] = (traj.category, bool(traj.success))
        rewards[traj.task_id] = float(traj.reward)
    if details is not None:
        details.parent.mkdir(parents=True, exist_ok=True)
        with open(details, "a") as f:
            for traj in trajectories:
                f.write(
                    json.dumps(
                        {
                            "snapshot": name,
                            "task_id": traj.task_id,
                            "category": traj.category,
                            "success": bool(traj.success),
                            "reward": float(traj.reward),
                            "outcome": traj.outcome,
                            "tags": list(traj.tags),
                            "tool_calls": traj.num_tool_calls,
                            "error": traj.error,
                        }
                    )
                    + "\n"
                )
    return SnapshotRun(name, results, digest, wall, sum(t.num_generated_tokens for t in trajectories), rewards)


def curve_point(run: SnapshotRun, step: int, held_out: Sequence[str]) -> dict[str, Any]:
    """One snapshot's success per category and over the held-in pool (counts and 95% intervals)."""
    categories = sorted({c for c, _ in run.results.values()}, key=lambda c: (c in held_out, c))
    rows = {c: in_category(run.results, c) for c in categories}
    if len([c for c in categories if c not in held_out]) > 1:
        rows[HELD_IN_ALL] = held_in(run.results, held_out)
    return {
        "name": run.name,
        "step": step,
        "rows": {name: rate_record(Rate(sum(r.values()), len(r))) for name, r in rows.items()},
    }


def final_record(
    runs: Sequence[SnapshotRun], steps: Mapping[str, int], tasks: FinalTasks, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """What final.json holds: the first snapshot against the last (rows), every snapshot's
    success per category (``curve``, in training order), names, timings, prompt digest, settings."""
    before, after = runs[0], runs[-1]
    for run in runs[1:]:
        if run.prompt_digest != before.prompt_digest:
            raise ValueError(
                f"{before.name} and {run.name} saw different opening prompts "
                f"({before.prompt_digest} vs {run.prompt_digest}): the comparison would not be fair"
            )
    rows = before_after_rows(before.results, after.results, tasks.held_out)
    return {
        "before": before.name,
        "after": after.name,
        "rows": [row_record(r) for r in rows],
        "curve": [curve_point(run, steps[run.name], tasks.held_out) for run in runs],
        "held_out": list(tasks.held_out),
        "tasks": len(tasks.task_ids),
        "prompt_digest": before.prompt_digest,
        "wall_s": {run.name: run.wall_s for run in runs},
        "generated_tokens": {run.name: run.generated_tokens for run in runs},
        # Beside success (the reward at the env's success_threshold): the mean reward, which partial credit moves too.
        "reward_mean": {run.name: sum(run.rewards.values()) / len(run.rewards) for run in runs if run.rewards},
        "partial_credit": any(r not in (0.0, 1.0) for run in runs for r in run.rewards.values()),
        "settings": {**settings, "steps": dict(steps)},
    }


def write_final(run_dir: Path, record: Mapping[str, Any]) -> Path:
    path = Path(run_dir) / "evaluation" / FINAL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_final_tasks(run_dir: Path) -> dict[str, dict[str, tuple[str, bool]]]:
    """final_tasks.jsonl by snapshot: name -> task id -> (category, success)."""
    by_snapshot: dict[str, dict[str, tuple[str, bool]]] = {}
    for line in (Path(run_dir) / "evaluation" / FINAL_TASKS_FILE).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_snapshot.setdefault(r["snapshot"], {})[r["task_id"]] = (r["category"], bool(r["success"]))
    return by_snapshot


def read_final(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "evaluation" / FINAL_FILE
    return json.loads(path.read_text()) if path.is_file() else None
