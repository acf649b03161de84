"""Env scaling: BFCL episodes/s and tool calls/s with 1, 2, 4, 8 env actors.

The generator is replaced by a replay of recorded trajectories (the ground
truth of each task, as `seal env replay-gt` plays it), so only the env pool is
measured: each Ray actor resets a BfclEnv, steps it with the recorded texts
(real API execution), then runs the verifier and the diagnosis (env.result()).
Every actor plays the same number of episodes per round (weak scaling) from a
common start; rate = all episodes / time until the last actor finishes.
Counts are measured in turn within each repeat, the order reversed every
other repeat, so a change in outside load hits all of them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, error_bars, figure, log, save_figure, summary, table
from env_pool.base import play_scripted
from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.replay import ground_truth_turns
from env_pool.bfcl.tasks import get_task, split_ids

NAME = "env"


def add_arguments(parser) -> None:
    parser.add_argument("--actors", default="1,2,4,8", help="env actor counts, comma-separated")
    parser.add_argument("--episodes", type=int, default=400, help="episodes per actor per measurement")
    parser.add_argument("--format", default="json", choices=["json", "python"], dest="tool_format")
    parser.add_argument("--split", default="all", choices=["train", "test", "all"])


class ReplayEnvActor:
    """One env worker: a BfclEnv and the recorded step texts of its tasks."""

    def __init__(self, index: int, task_ids: list[str], tool_format: str) -> None:
        self.env = BfclEnv(tool_format=tool_format)
        # Each actor starts at a different task so the pool plays a mix at any moment.
        shift = (index * 97) % len(task_ids)
        ids = task_ids[shift:] + task_ids[:shift]
        self.plans = [(t, ground_truth_turns(get_task(t), tool_format)) for t in ids]
        self.cursor = 0

    def play(self, episodes: int) -> dict[str, Any]:
        steps = calls = failed = 0
        t0 = time.perf_counter()
        for _ in range(episodes):
            task_id, turns = self.plans[self.cursor % len(self.plans)]
            self.cursor += 1
            result = play_scripted(self.env, task_id, turns)
            steps += result.num_steps
            calls += result.num_tool_calls
            failed += result.reward != 1  # ground truth must pass: a failure is a broken env, not a slow one
        return {
            "episodes": episodes,
            "steps": steps,
            "tool_calls": calls,
            "failed": failed,
            "seconds": time.perf_counter() - t0,
        }

    def pid(self) -> int:
        return os.getpid()


def _measure(actors: list, episodes: int) -> dict[str, float]:
    import ray

    t0 = time.perf_counter()
    results = ray.get([a.play.remote(episodes) for a in actors])
    wall = time.perf_counter() - t0
    if any(r["failed"] for r in results):
        raise RuntimeError(f"{sum(r['failed'] for r in results)} ground-truth episodes did not pass the verifier")
    return {
        "episodes_per_s": sum(r["episodes"] for r in results) / wall,
        "tool_calls_per_s": sum(r["tool_calls"] for r in results) / wall,
        "steps_per_s": sum(r["steps"] for r in results) / wall,
        "wall_s": wall,
    }


def run(args) -> dict[str, Any]:
    import ray

    counts = sorted({int(x) for x in args.actors.split(",") if x.strip()})
    if not counts or counts[0] < 1:
        raise ValueError(f"--actors needs counts >= 1, got {args.actors!r}")
    task_ids = split_ids(args.split)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    owns = not ray.is_initialized()
    if owns:
        # One logical CPU per actor even where there are fewer cores: the
        # point is to oversubscribe and see where the curve bends. address="local":
        # a new instance, never a cluster someone else started on this machine.
        ray.init(
            address="local", num_cpus=max(os.cpu_count() or 1, counts[-1]), include_dashboard=False, log_to_driver=False
        )
    try:
        # The actor class lives in this module: its workers need the checkout on their path.
        env_vars = {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "BFCL_PROJECT_ROOT": os.environ.get(
                "BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "seal" / "bfcl_root")
            ),
        }
        Path(env_vars["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
        remote = ray.remote(ReplayEnvActor).options(num_cpus=1, runtime_env={"env_vars": env_vars})
        pool = [remote.remote(i, task_ids, args.tool_format) for i in range(counts[-1])]
        log(f"[{NAME}] {len(pool)} env actors starting")
        pids = ray.get([a.pid.remote() for a in pool])
        _measure(pool, min(args.episodes, 50))  # imports, caches, first calls
        per_count: dict[int, list[dict[str, float]]] = {c: [] for c in counts}
        for r in range(args.repeats):
            for c in counts if r % 2 == 0 else counts[::-1]:
                log(f"[{NAME}] repeat {r + 1}/{args.repeats}: {c} actors x {args.episodes} episodes")
                per_count[c].append(_measure(pool[:c], args.episodes))
        for a in pool:
            ray.kill(a)
    finally:
        if owns:
            ray.shutdown()
    eps = {c: summary([m["episodes_per_s"] for m in per_count[c]]) for c in counts}
    calls = {c: summary([m["tool_calls_per_s"] for m in per_count[c]]) for c in counts}
    base = eps[counts[0]]["median"] / counts[0]
    efficiency = [eps[c]["median"] / (c * base) for c in counts]
    # Where it bends: the first count whose parallel efficiency drops under 0.8.
    knee = next((c for c, e in zip(counts, efficiency) if e < 0.8), None)
    return {
        "actors": counts,
        "episodes_per_s": [eps[c]["median"] for c in counts],
        "tool_calls_per_s": [calls[c]["median"] for c in counts],
        "episodes_per_s_spread": [eps[c] for c in counts],
        "tool_calls_per_s_spread": [calls[c] for c in counts],
        "parallel_efficiency": efficiency,
        "bends_at_actors": knee,
        "episodes_per_actor": args.episodes,
        "tool_format": args.tool_format,
        "split": args.split,
        "tasks": len(task_ids),
        "distinct_processes": len(set(pids)),
        "repeats": {str(c): per_count[c] for c in counts},
        "notes": [
            "generator replaced by recorded ground-truth texts; each episode: env reset, real API execution, verifier, diagnosis",
            "parallel_efficiency = rate(k) / (k * rate(first count) / first count); bends_at_actors: first count below 0.8",
            f"the machine has {os.cpu_count()} cores: beyond that, actors share cores",
        ],
    }


def render(report: dict[str, Any]) -> str:
    rows = [
        (c, e, s["min"], s["max"], t, eff)
        for c, e, s, t, eff in zip(
            report["actors"],
            report["episodes_per_s"],
            report["episodes_per_s_spread"],
            report["tool_calls_per_s"],
            report["parallel_efficiency"],
        )
    ]
    out = table(rows, ["actors", "episodes/s", "min", "max", "tool calls/s", "efficiency"])
    return out + f"\nbends at: {report['bends_at_actors'] or 'no bend in range'} actors (efficiency < 0.8)"


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax,) = figure(1)
    counts = report["actors"]
    med, err = error_bars(report["episodes_per_s_spread"])
    ax.errorbar(counts, med, yerr=err, marker="o", label="measured", capsize=3)
    per_actor = med[0] / counts[0]
    ax.plot(counts, [c * per_actor for c in counts], linestyle="--", color="grey", label="linear")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("env actors")
    ax.set_ylabel("episodes/s (env + verifier + diagnosis)")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, NAME, f"env pool scaling on {os.cpu_count()} cores (BFCL ground-truth replay)")
