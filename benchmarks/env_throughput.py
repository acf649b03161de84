"""Env throughput: one process replaying BFCL ground truth, with and without diagnosis.

Modes run interleaved, round by round, so both see the same machine load; the
outside load (1-minute load average) is recorded before and after. Prints a
table and writes JSON (default benchmarks/results/env_throughput.json).

    .venv/bin/python benchmarks/env_throughput.py [--rounds 3] [--episodes 800] [--memory-episodes 3000]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import time

from _report import write_report

from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.replay import ground_truth_turns
from env_pool.bfcl.tasks import get_task, split_ids


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_pass(env, plans, with_diagnosis: bool) -> dict:
    steps = calls = 0
    t0 = time.perf_counter()
    for task_id, turns in plans:
        env.reset(task_id)
        for turn in turns:
            for text in turn:
                result = env.step(text)
                steps += 1
                calls += result.num_calls
                if result.turn_ended or result.done:
                    break
            if env.done:
                break
        if with_diagnosis:
            assert env.result().reward == 1
    seconds = time.perf_counter() - t0
    return {"episodes": len(plans), "steps": steps, "tool_calls": calls, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=800, help="episodes per pass (tasks cycled)")
    parser.add_argument("--memory-episodes", type=int, default=3000)
    parser.add_argument("--format", default="json", choices=["json", "python"])
    parser.add_argument("--out", default="benchmarks/results/env_throughput.json")
    args = parser.parse_args()

    ids = split_ids("all")
    plans = [
        (ids[i % len(ids)], ground_truth_turns(get_task(ids[i % len(ids)]), args.format)) for i in range(args.episodes)
    ]
    env = BfclEnv(tool_format=args.format)
    run_pass(env, plans[:100], True)  # warm caches and imports
    load_before = os.getloadavg()[0]
    totals = {"env only": [], "env + verifier + diagnosis": []}
    for _ in range(args.rounds):
        totals["env only"].append(run_pass(env, plans, False))
        totals["env + verifier + diagnosis"].append(run_pass(env, plans, True))

    rng = random.Random(0)
    mem_plans = [
        (t, ground_truth_turns(get_task(t), args.format))
        for t in (rng.choice(ids) for _ in range(args.memory_episodes))
    ]
    gc.collect()
    rss0 = rss_mb()
    run_pass(env, mem_plans, True)
    gc.collect()
    rss1 = rss_mb()
    load_after = os.getloadavg()[0]

    rows = []
    for mode, passes in totals.items():
        best = min(passes, key=lambda p: p["seconds"])
        median = sorted(p["seconds"] for p in passes)[len(passes) // 2]
        rows.append(
            {
                "mode": mode,
                "episodes_per_s": best["episodes"] / median,
                "steps_per_s": best["steps"] / median,
                "tool_calls_per_s": best["tool_calls"] / median,
                "median_seconds": median,
                "passes": passes,
            }
        )
    report = {
        "benchmark": "env_throughput",
        "format": args.format,
        "process": "one process, one core",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "outside_load_1min": {"before": load_before, "after": load_after},
        "results": rows,
        "diagnosis_cost_ratio": rows[0]["episodes_per_s"] / rows[1]["episodes_per_s"],
        "memory": {
            "episodes": args.memory_episodes,
            "rss_mb_before": rss0,
            "rss_mb_after": rss1,
            "growth_mb": rss1 - rss0,
        },
    }
    print(f"{'mode':<30}{'episodes/s':>12}{'steps/s':>10}{'calls/s':>10}")
    for r in rows:
        print(f"{r['mode']:<30}{r['episodes_per_s']:>12.0f}{r['steps_per_s']:>10.0f}{r['tool_calls_per_s']:>10.0f}")
    print(f"diagnosis costs x{report['diagnosis_cost_ratio']:.2f} in episodes/s")
    print(f"memory over {args.memory_episodes} episodes: {rss0:.1f} -> {rss1:.1f} MB RSS")
    print(f"outside load (1-min avg): {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
