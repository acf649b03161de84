"""`seal rollout` (tagged training trajectories) and `seal eval` (raw interface, greedy)."""
from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace


def _setup(overrides: list[str], extra: list[str]):
    from seal.config import compose, instantiate

    cfg = compose(list(overrides) + extra)
    env_cfg = cfg.env
    make_env = lambda: instantiate(env_cfg)  # noqa: E731 - one env object per concurrent episode
    probe = make_env()
    return cfg, make_env, probe, instantiate


def _generator(cfg, instantiate):
    from actors.chat import ChatTokenizer

    print(f"starting generator ({cfg.generator._target_.rsplit('.', 1)[-1]}, model={cfg.model.path}) ...", file=sys.stderr, flush=True)
    generator = instantiate(cfg.generator)
    return generator, ChatTokenizer(generator.tokenizer)


def rollout(args) -> int:
    from tqdm import tqdm

    from actors.rollout import GroupStats, run_group
    from seal.errors import CliError

    if args.tasks < 1 or args.n < 1:
        raise CliError("--tasks and --n must be >= 1")
    cfg, make_env, probe, instantiate = _setup(args.overrides, [f"n={args.n}"])
    interface = instantiate(cfg.interface)
    sampling = instantiate(cfg.sampling)
    ids = probe.task_ids(cfg.split)[: args.tasks]
    generator, chat = _generator(cfg, instantiate)
    stats = GroupStats()
    tags: Counter = Counter()
    rewards = []
    t0 = time.perf_counter()
    with open(args.out, "w", encoding="utf-8") as out:
        for i, task_id in enumerate(tqdm(ids, desc="groups", unit="group")):
            group = run_group(make_env, generator, chat, task_id, args.n, sampling, interface,
                              group_id=f"g{i:05d}", seed=cfg.seed + i, stats=stats)
            for traj in group:
                out.write(json.dumps(traj.to_dict()) + "\n")
                tags.update(traj.tags)
                rewards.append(traj.reward)
    seconds = time.perf_counter() - t0
    print(f"wrote {len(rewards)} trajectories ({len(ids)} groups of {args.n}) to {args.out} in {seconds:.0f} s")
    print(f"mean reward {sum(rewards) / len(rewards):.3f}; {stats.generated_tokens} generated tokens "
          f"({stats.generated_tokens / max(stats.generate_s, 1e-9):.1f} tokens/s); prefix-cache hit rate {stats.prefix_cache_hit_rate:.1%}")
    total = sum(tags.values())
    for tag, count in tags.most_common():
        print(f"  {tag:<28}{count:>6}  {'#' * max(1, round(40 * count / total))}")
    return 0


def evaluate(args) -> int:
    from tqdm import tqdm

    from actors.rollout import run_group
    from env_pool.interface.state import RAW_INTERFACE

    cfg, make_env, probe, instantiate = _setup(args.overrides, ["sampling=eval", "n=1"])
    sampling = instantiate(cfg.sampling)
    ids = probe.task_ids(args.split)
    if args.limit is not None:
        ids = ids[: args.limit]
    generator, chat = _generator(cfg, instantiate)
    by_cat: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter = Counter()
    for i, task_id in enumerate(tqdm(ids, desc="eval", unit="task")):
        (traj,) = run_group(make_env, generator, chat, task_id, 1, replace(sampling, seed=cfg.seed), RAW_INTERFACE, group_id=f"eval{i:05d}")
        by_cat[traj.category].append(traj.reward)
        outcomes[traj.outcome] += 1
    per_cat = {c: sum(v) / len(v) for c, v in sorted(by_cat.items())}
    overall = sum(per_cat.values()) / len(per_cat) if per_cat else 0.0  # macro average
    if args.json:
        print(json.dumps({"overall": overall, "by_category": per_cat, "tasks": len(ids)}))
    else:
        print(f"evaluation: split={args.split}, {len(ids)} tasks, raw interface, greedy")
        for c, v in per_cat.items():
            print(f"  {c:<14}{100 * v:6.2f}%  ({len(by_cat[c])} tasks)")
        print(f"  {'overall':<14}{100 * overall:6.2f}%  (macro average)")
        print("outcomes: " + ", ".join(f"{k}={v}" for k, v in outcomes.items()))
    return 0
