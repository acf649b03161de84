"""Running a snapshot on a view's tasks: raw interface, greedy, one rollout per
task, the tasks of a view played together (one engine batch per generation step), results
cached so a repeated `seal evaluate` only runs what is missing.

The cache is RUN_DIR/evaluation/cache/<snapshot>.jsonl, one line per finished
task, appended as each batch of tasks ends (an interrupted evaluation keeps what it
did). A line is reused only when everything that decides the rollout matches:
the snapshot's weights, the env config, the sampling settings and the seed
(hashed into ``key``). Greedy decoding makes a task's result a function of
these, so a task shared by two views is run once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from env_pool.interface.state import RAW_INTERFACE
from evaluation.catalog import task_category
from evaluation.records import TaskResult
from rollout.generator import GeneratorUnavailable
from rollout.play import run_episodes, run_group


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
    return _task_result(traj, snapshot, view, time.perf_counter() - t0)


def play_tasks(
    make_env: Callable[[], Any],
    generator: Any,
    chat: Any,
    task_ids: Sequence[str],
    sampling: Any,
    *,
    snapshot: str,
    view: str,
    seed: int,
) -> list[TaskResult]:
    """The tasks' greedy rollouts under the raw interface, played together as the closing
    evaluation plays them (rollout/play.py run_episodes: one engine batch per generation step).
    An exception out of the batch as a whole (not the engine going away) plays the tasks again one
    at a time, so a task that crashes costs only its own result."""
    t0 = time.perf_counter()
    try:
        trajectories = run_episodes(
            make_env,
            generator,
            chat,
            list(task_ids),
            replace(sampling, seed=seed),
            RAW_INTERFACE,
            group_id=f"eval-{snapshot}-{view}",
            seed=seed,
        )
    except GeneratorUnavailable:
        raise
    except Exception:  # each task again on its own; run_task records a crash as its result
        return [
            run_task(make_env, generator, chat, t, sampling, snapshot=snapshot, view=view, seed=seed) for t in task_ids
        ]
    return [_task_result(traj, snapshot, view, time.perf_counter() - t0) for traj in trajectories]


def _task_result(traj: Any, snapshot: str, view: str, wall_s: float) -> TaskResult:
    generated = traj.num_generated_tokens
    return TaskResult(
        snapshot=snapshot,
        view=view,
        task_id=traj.task_id,
        category=traj.category,
        success=traj.success,
        reward=traj.reward,
        tool_calls=traj.num_tool_calls,
        generated_tokens=generated,
        prompt_tokens=len(traj.token_ids) - generated,  # opening prompt plus every observation fed back
        wall_s=traj.timings.get("total_s", wall_s),
        process_error=traj.error,
        outcome=traj.outcome,
    )


def run_view(
    tasks: Iterable[str],
    *,
    cache: ResultCache,
    key: str,
    view: str,
    runner: Callable[[list[str]], list[TaskResult]],
    batch: int = 1,
    progress: Callable[[int, bool], None] | None = None,
) -> list[TaskResult]:
    """Results of a view's tasks: cached ones as they are, the others run ``batch`` at a time
    (``runner`` takes a list of task ids) and cached as each batch ends (an interrupted evaluation
    keeps what it did). ``progress(count, ran)``: ``count`` more tasks done, run or from the cache."""
    tasks = list(tasks)
    found = {t: cache.get(key, t, view) for t in tasks}
    hits = sum(r is not None for r in found.values())
    if progress is not None and hits:
        progress(hits, False)
    todo = [t for t in tasks if found[t] is None]
    for start in range(0, len(todo), max(1, batch)):
        chunk = todo[start : start + max(1, batch)]
        results = runner(chunk)
        if [r.task_id for r in results] != chunk:
            raise ValueError(f"the runner of view {view} answered {len(results)} results for {len(chunk)} tasks")
        for result in results:
            cache.put(key, result)
            found[result.task_id] = result
        if progress is not None:
            progress(len(chunk), True)
    return [found[t] for t in tasks]  # type: ignore[misc]


def missing(tasks_by_view: Mapping[str, Iterable[str]], cache: ResultCache, keys: Mapping[str, str]) -> int:
    """How many (view, task) runs the cache cannot answer: 0 means no engine is needed."""
    return sum(1 for view, tasks in tasks_by_view.items() for t in tasks if cache.get(keys[view], t, view) is None)
