"""Running a snapshot on a view's tasks: raw interface, greedy, one rollout per
task, results cached so a repeated `seal evaluate` only runs what is missing.

The cache is RUN_DIR/evaluation/cache/<snapshot>.jsonl, one line per finished
task, appended as each task ends (an interrupted evaluation keeps what it
did). A line is reused only when everything that decides the rollout matches:
the snapshot's weights, the env config, the sampling settings and the seed
(hashed into ``key``). Greedy decoding makes a task's result a function of
these, so a task shared by two views is run once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from evaluation.catalog import task_category
from evaluation.records import TaskResult


def settings_key(**parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultCache:
    def __init__(self, root: Path, snapshot: str) -> None:
        self.path = Path(root) / f"{snapshot}.jsonl"
        self.snapshot = snapshot
        self._rows: dict[tuple[str, str], TaskResult] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self._rows[(row["key"], row["result"]["task_id"])] = TaskResult.from_dict(row["result"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash mid-write: that task is simply run again

    def get(self, key: str, task_id: str, view: str) -> TaskResult | None:
        hit = self._rows.get((key, task_id))
        return None if hit is None else replace(hit, view=view)

    def put(self, key: str, result: TaskResult) -> None:
        self._rows[(key, result.task_id)] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "result": result.to_dict()}) + "\n")


def _category(task_id: str) -> str:
    try:
        return task_category(task_id)
    except KeyError:
        return "unknown"


def run_task(
    make_env: Callable[[], Any],
    generator: Any,
    chat: Any,
    task_id: str,
    sampling: Any,
    *,
    snapshot: str,
    view: str,
    seed: int,
) -> TaskResult:
    """One greedy rollout of a task under the raw interface as a TaskResult.

    Generation errors come back inside the trajectory (run_group ends the
    episode with a named error); an exception from the environment is caught
    here as a crash. Either way the verifier's verdict (or a failure, when
    there is none) stays the success value and the error is a diagnostic.
    """
    from env_pool.interface.state import RAW_INTERFACE
    from rollout.generator import GeneratorUnavailable
    from rollout.play import run_group

    t0 = time.perf_counter()
    try:
        (traj,) = run_group(
            make_env,
            generator,
            chat,
            task_id,
            1,
            replace(sampling, seed=seed),
            RAW_INTERFACE,
            group_id=f"eval-{snapshot}-{task_id}",
            seed=seed,
        )
    except GeneratorUnavailable:
        raise  # the engine is gone: no later task could run either
    except Exception as exc:
        return TaskResult(
            snapshot,
            view,
            task_id,
            _category(task_id),
            False,
            0.0,
            0,
            0,
            0,
            time.perf_counter() - t0,
            process_error=f"crash: {exc.__class__.__name__}: {exc}",
            outcome="aborted",
        )
    generated = traj.num_generated_tokens
    return TaskResult(
        snapshot=snapshot,
        view=view,
        task_id=task_id,
        category=traj.category,
        success=traj.success,
        reward=traj.reward,
        tool_calls=traj.num_tool_calls,
        generated_tokens=generated,
        prompt_tokens=len(traj.token_ids) - generated,  # opening prompt plus every observation fed back
        wall_s=traj.timings.get("total_s", time.perf_counter() - t0),
        process_error=traj.error,
        outcome=traj.outcome,
    )


def run_view(
    tasks: Iterable[str],
    *,
    cache: ResultCache,
    key: str,
    view: str,
    runner: Callable[[str], TaskResult],
    progress: Callable[[int], None] | None = None,
) -> list[TaskResult]:
    """Results of a view's tasks: cached ones as they are, the others run and cached."""
    out = []
    for task_id in tasks:
        hit = cache.get(key, task_id, view)
        if hit is None:
            hit = runner(task_id)
            cache.put(key, hit)
        out.append(hit)
        if progress is not None:
            progress(1)
    return out


def missing(tasks_by_view: Mapping[str, Iterable[str]], cache: ResultCache, keys: Mapping[str, str]) -> int:
    """How many (view, task) runs the cache cannot answer: 0 means no engine is needed."""
    return sum(1 for view, tasks in tasks_by_view.items() for t in tasks if cache.get(keys[view], t, view) is None)
