"""`seal rollout` (tagged training trajectories) and `seal eval` (raw interface, greedy)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace

from tqdm import tqdm

from env_pool.interface.state import RAW_INTERFACE
from rollout.play import GroupStats, run_group
from seal import chat_setup
from seal.config import compose, instantiate, instantiate_spec
from seal.console import Paced, results
from seal.errors import CliError
from seal.run.task_fit import chat_tokenizer, fit_tasks, prompt_room, room_text
from seal.runtime.generator_spec import local_generator_spec


def _setup(overrides: list[str], extra: list[str]):
    cfg = compose(list(overrides) + extra)
    env_cfg = cfg.env
    make_env = lambda: instantiate(env_cfg)  # one env object per concurrent episode
    probe = make_env()
    return cfg, make_env, probe, instantiate


def choose_tasks(cfg, env, interface, default_ids: list[str], named: str | None) -> tuple[list[str], int, str]:
    """The tasks to play, how many were skipped and the line that says so ("" if none).

    As `seal train` does (seal/run/task_fit.py), tasks whose opening prompt cannot fit the
    model's context are skipped: they would end at once as context overflows with no
    generated token. Tasks the user named (--task-ids) are not skipped but refused.
    Only the tokenizer is loaded here, so a refusal comes before the engine starts."""
    ids = default_ids
    if named is not None:
        ids = [t.strip() for t in named.split(",")]
        if not all(ids):
            raise CliError(
                f"--task-ids takes comma-separated task ids, e.g. {','.join(env.task_ids('all')[:2])}; got {named!r}"
            )
        known = set(env.task_ids("all"))
        if unknown := [t for t in ids if t not in known]:
            raise CliError(
                f"unknown task id{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for env {type(env).__name__}"
            )
    if not ids:
        raise CliError("no tasks to play (check --split and the task count)")
    fit = fit_tasks(chat_tokenizer(cfg), env, interface, ids, prompt_room(cfg))
    if named is not None and fit.overlong:
        (task, length), more = fit.overlong[0], len(fit.overlong) - 1
        raise CliError(
            f"task {task}: its opening prompt is {length} tokens, longer than {room_text(cfg)}"
            + (f"; {more} more named task(s) do not fit either" if more else "")
        )
    note = fit.note(room_text(cfg))
    if not fit.keep:
        raise CliError(f"no task left to play: {note}")
    return fit.keep, len(fit.overlong), note


def _generator(cfg, instantiate):
    spec = local_generator_spec(cfg.generator)  # one engine in this process, blocking calls (whatever trains)
    print(
        f"starting generator ({spec['_target_'].rsplit('.', 1)[-1]}, model={cfg.model.path}) ...",
        file=sys.stderr,
        flush=True,
    )
    generator = instantiate_spec(spec)
    return generator, chat_setup.chat_tokenizer(cfg, generator.tokenizer)


def rollout(args) -> int:
    if args.task_ids is not None and args.tasks is not None:
        raise CliError("--tasks and --task-ids do not go together: --task-ids names the tasks")
    tasks = 4 if args.tasks is None else args.tasks
    if tasks < 1 or args.n < 1:
        raise CliError("--tasks and --n must be >= 1")
    cfg, make_env, probe, instantiate = _setup(args.overrides, [f"n={args.n}"])
    interface = instantiate(cfg.interface)
    sampling = instantiate(cfg.sampling)
    ids, _, note = choose_tasks(cfg, probe, interface, probe.task_ids(cfg.split)[:tasks], args.task_ids)
    if note:
        print(note, file=results(), flush=True)
    generator, chat = _generator(cfg, instantiate)
    stats = GroupStats()
    tags: Counter = Counter()
    rewards = []
    t0 = time.perf_counter()
    paced = Paced(len(ids), "groups")  # a line every 30 s: a group takes minutes on a CPU
    with paced.heartbeat, open(args.out, "w", encoding="utf-8") as out:
        for i, task_id in enumerate(tqdm(ids, desc="groups", unit="group")):
            paced.starts(f"rollout: group {i + 1} of {len(ids)} ({task_id}, n={args.n}) playing")
            group = run_group(
                make_env,
                generator,
                chat,
                task_id,
                args.n,
                sampling,
                interface,
                group_id=f"g{i:05d}",
                seed=cfg.seed + i,
                stats=stats,
            )
            paced.ends()
            for traj in group:
                out.write(json.dumps(traj.to_dict()) + "\n")
                tags.update(traj.tags)
                rewards.append(traj.reward)
    seconds = time.perf_counter() - t0
    out = results()
    print(
        f"wrote {len(rewards)} trajectories ({len(ids)} groups of {args.n}) to {args.out} in {seconds:.0f} s", file=out
    )
    print(
        f"mean reward {sum(rewards) / len(rewards):.3f}; {stats.generated_tokens} generated tokens "
        f"({stats.generated_tokens / max(stats.generate_s, 1e-9):.1f} tokens/s); prefix-cache hit rate {stats.prefix_cache_hit_rate:.1%}",
        file=out,
    )
    total = sum(tags.values())
    for tag, count in tags.most_common():
        print(f"  {tag:<28}{count:>6}  {'#' * max(1, round(40 * count / total))}", file=out)
    return 0


def evaluate(args) -> int:
    if args.task_ids is not None and (args.split is not None or args.limit is not None):
        raise CliError("--task-ids does not go with --split or --limit: it names the tasks")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be >= 1, got {args.limit}")
    split = args.split or "test"
    cfg, make_env, probe, instantiate = _setup(args.overrides, ["sampling=eval", "n=1"])
    sampling = instantiate(cfg.sampling)
    ids = probe.task_ids(split)
    if args.limit is not None:
        ids = ids[: args.limit]
    ids, skipped, note = choose_tasks(cfg, probe, RAW_INTERFACE, ids, args.task_ids)
    if note:  # stderr under --json: stdout stays one JSON object
        print(note, file=sys.stderr if args.json else results(), flush=True)
    generator, chat = _generator(cfg, instantiate)
    by_cat: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter = Counter()
    paced = Paced(len(ids), "tasks")  # a line every 30 s: a task can take minutes on a CPU
    with paced.heartbeat:
        for i, task_id in enumerate(tqdm(ids, desc="eval", unit="task")):
            paced.starts(f"eval: task {i + 1} of {len(ids)} ({task_id}) playing")
            (traj,) = run_group(
                make_env,
                generator,
                chat,
                task_id,
                1,
                replace(sampling, seed=cfg.seed),
                RAW_INTERFACE,
                group_id=f"eval{i:05d}",
            )
            paced.ends()
            by_cat[traj.category].append(traj.reward)
            outcomes[traj.outcome] += 1
    per_cat = {c: sum(v) / len(v) for c, v in sorted(by_cat.items())}
    overall = sum(per_cat.values()) / len(per_cat) if per_cat else 0.0  # macro average
    out = results()
    if args.json:
        print(json.dumps({"overall": overall, "by_category": per_cat, "tasks": len(ids), "skipped": skipped}), file=out)
    else:
        where = f"split={split}" if args.task_ids is None else "named tasks"
        print(f"evaluation: {where}, {len(ids)} tasks ({skipped} skipped), raw interface, greedy", file=out)
        for c, v in per_cat.items():
            print(f"  {c:<14}{100 * v:6.2f}%  ({len(by_cat[c])} tasks)", file=out)
        print(f"  {'overall':<14}{100 * overall:6.2f}%  (macro average)", file=out)
        print("outcomes: " + ", ".join(f"{k}={v}" for k, v in outcomes.items()), file=out)
    return 0
