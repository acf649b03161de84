"""`seal train`: the main job.

The asynchronous trainer (generators, learner, replay queue, coordinator)
plugs in here as those parts land. Until then the job runs the strongest
end-to-end path that exists: every task of the split through the
environment with the training interface, the verifier and the diagnosis,
driven by the reference (ground-truth) agent; then one closed-loop interface
update from the resulting failure profile. It writes the run directory the
trainer will write.
"""
from __future__ import annotations

import json
import time
from collections import Counter, defaultdict


def run(args) -> int:
    from omegaconf import OmegaConf
    from tqdm import tqdm

    from env_pool.base import play_scripted
    from env_pool.interface.guidelines import TagStat, evolve
    from seal.config import compose, instantiate
    from seal.run_dir import create_run_dir

    cfg = compose(args.overrides)
    env = instantiate(cfg.env)
    interface = instantiate(cfg.interface)
    ids = env.task_ids(cfg.split)
    if cfg.limit is not None:
        ids = ids[: int(cfg.limit)]
    run_dir = create_run_dir(cfg.run_dir, cfg, list(args.overrides))
    print(f"run dir: {run_dir}")
    print("stage: environment (reference agent through env, verifier, diagnosis, interface); the learner is not built yet")

    profile: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_cat: dict[str, Counter] = defaultdict(Counter)
    t0 = time.perf_counter()
    with open(run_dir / "episodes.jsonl", "w") as out:
        for task_id in tqdm(ids, desc="episodes", unit="ep", mininterval=0.5):
            result = play_scripted(env, task_id, env.reference_turns(task_id), interface)
            out.write(json.dumps(result.to_dict()) + "\n")
            by_cat[result.category]["tasks"] += 1
            by_cat[result.category]["success"] += result.reward
            for tag in result.tags:
                profile[tag][0] += 1
                profile[tag][1] += result.reward
    seconds = time.perf_counter() - t0
    new_interface = evolve(interface, {t: TagStat(int(c), r) for t, (c, r) in profile.items()})
    summary = {
        "episodes": len(ids),
        "success": sum(c["success"] for c in by_cat.values()),
        "by_category": {k: dict(v) for k, v in sorted(by_cat.items())},
        "tags": {t: int(c) for t, (c, _) in sorted(profile.items())},
        "env_stats": env.stats.to_dict(),
        "seconds": round(seconds, 2),
        "interface_before": interface.to_dict(),
        "interface_after": new_interface.to_dict(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{summary['success']}/{summary['episodes']} episodes succeeded in {seconds:.1f} s "
          f"({env.stats.tool_calls} tool calls, {env.stats.tool_calls / max(seconds, 1e-9):.0f} calls/s)")
    for cat, c in summary["by_category"].items():
        print(f"  {cat:<14}{c['success']:>4}/{c['tasks']}")
    print("tags: " + ", ".join(f"{k}={v}" for k, v in summary["tags"].items()))
    print(f"interface v{new_interface.version}: guidelines {list(new_interface.active_guidelines) or 'none'}")
    print(f"wrote {run_dir}/summary.json, episodes.jsonl, config.yaml")
    return 0 if summary["success"] == summary["episodes"] else 1
