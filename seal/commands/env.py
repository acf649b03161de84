"""`seal env ...`: replay ground truth, score trajectory files, show prompts."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from seal.errors import CliError


def _interface(components: str, guidelines: str = ""):
    from env_pool.interface.state import RAW_INTERFACE

    state = RAW_INTERFACE.with_components(components) if components else RAW_INTERFACE
    if guidelines:
        from dataclasses import replace

        kinds = tuple(k.strip() for k in guidelines.split(",") if k.strip())
        state = replace(state, guidelines=True, active_guidelines=kinds)
    return state


# ------------------------------------------------------------------ replay-gt
def replay_gt(args) -> int:
    from env_pool.base import play_scripted
    from env_pool.bfcl.env import BfclEnv
    from env_pool.bfcl.replay import ground_truth_turns
    from env_pool.bfcl.tasks import CATEGORIES, get_task, split_ids

    interface = _interface(args.interface)
    env = BfclEnv(tool_format=args.tool_format)
    by_cat = {c: {"tasks": 0, "reward_1": 0} for c in CATEGORIES}
    tag_counts: Counter = Counter()
    failures = []
    t0 = time.perf_counter()
    ids = split_ids(args.split)
    for task_id in ids:
        task = get_task(task_id)
        result = play_scripted(env, task_id, ground_truth_turns(task, args.tool_format), interface)
        by_cat[task.category]["tasks"] += 1
        by_cat[task.category]["reward_1"] += result.reward
        tag_counts.update(result.tags)
        if not result.reward:
            failures.append((task_id, result.error_type))
    seconds = time.perf_counter() - t0
    summary = {
        "tasks": len(ids),
        "reward_1": sum(c["reward_1"] for c in by_cat.values()),
        "by_category": {c: v for c, v in by_cat.items() if v["tasks"]},
        "tags": dict(sorted(tag_counts.items())),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"ground-truth replay, split={args.split}, format={args.tool_format}, interface={'raw' if interface.is_raw else args.interface}"
        )
        print(f"{'category':<14}{'tasks':>7}{'reward 1':>10}")
        for cat, v in summary["by_category"].items():
            print(f"{cat:<14}{v['tasks']:>7}{v['reward_1']:>10}")
        print(f"{'total':<14}{summary['tasks']:>7}{summary['reward_1']:>10}")
        print("tags: " + ", ".join(f"{k}={v}" for k, v in summary["tags"].items()))
        print(f"{env.stats.tool_calls} tool calls, {env.stats.steps} steps in {seconds:.2f} s")
        for task_id, error in failures[:20]:
            print(f"FAILED {task_id}: {error}")
    return 0 if summary["reward_1"] == summary["tasks"] else 1


# ---------------------------------------------------------------------- score
def _lines(path: str) -> Iterator[str]:
    if path == "-":
        yield from sys.stdin
        return
    try:
        with open(path, encoding="utf-8") as fh:
            yield from fh
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text: {exc}") from None


def _read_line(line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with task_id and turns")
    if not isinstance(obj.get("task_id"), str):
        raise ValueError("task_id must be a string")
    return obj


def _turns(obj: dict[str, Any]) -> list[list[str]]:
    turns = obj.get("turns")
    if not isinstance(turns, list) or not all(
        isinstance(t, list) and all(isinstance(s, str) for s in t) for t in turns
    ):
        raise ValueError("turns must be a list of lists of assistant step texts")
    return turns


def score(args) -> int:
    from env_pool.bfcl.judge import judge
    from env_pool.bfcl.runtime import call_signatures
    from env_pool.bfcl.tasks import get_task
    from env_pool.tool_calls import parse_step

    official = None
    if args.official:
        from env_pool.bfcl.official import official_verdict as official
    malformed = disagreements = 0
    for number, line in enumerate(_lines(args.file), start=1):
        if not line.strip():
            continue
        row: dict[str, Any] = {
            "line": number,
            "task_id": None,
            "reward": 0,
            "tags": [],
            "labels": [],
            "progress": 0.0,
            "error_type": None,
            "error": None,
        }
        try:
            obj = _read_line(line)
            task_id = row["task_id"] = obj["task_id"]
            turns = _turns(obj)
            task = get_task(task_id)
            if len(turns) > task.num_turns:
                raise ValueError(f"{len(turns)} turns given, {task_id} has {task.num_turns}")
            signatures = call_signatures(task.involved_classes)  # binds positional python arguments
            parsed = [[parse_step(s, args.tool_format, signatures) for s in turn] for turn in turns]
            diag = judge(task, parsed, args.instance_mismatch)
            row.update(diag.to_dict())
            if official is not None:
                valid, error_type = official(task, parsed)
                row["official"] = {"reward": int(valid), "error_type": error_type}
                disagreements += (int(valid), error_type) != (diag.reward, diag.error_type)
        except (ValueError, KeyError) as exc:
            malformed += 1
            row["error"] = str(exc.args[0]) if exc.args else str(exc)
        _print_score_row(row, args.json)
    if disagreements:
        print(f"seal: {disagreements} verdict(s) differ from bfcl-eval's checker", file=sys.stderr)
    if malformed:
        print(f"seal: {malformed} malformed line(s); the others were scored", file=sys.stderr)
    return 1 if (malformed or disagreements) else 0


def _print_score_row(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row))
    elif row["error"]:
        print(f"line {row['line']}: ERROR {row['error']}")
    else:
        print(
            f"line {row['line']} {row['task_id']}: reward={row['reward']} progress={row['progress']:.2f} "
            f"error_type={row['error_type'] or '-'}\n  tags:   {' '.join(row['tags'])}\n  labels: {' '.join(row['labels'])}"
        )


# ----------------------------------------------------------------------- show
def show(args) -> int:
    from env_pool.bfcl.env import BfclEnv
    from env_pool.bfcl.tasks import get_task

    interface = _interface(args.interface, args.guidelines)
    env = BfclEnv(tool_format=args.tool_format)
    task = get_task(args.task_id)
    messages = env.reset(args.task_id, interface)
    print(
        f"# {task.id} ({task.category}), format={args.tool_format}, interface v{interface.version}: {json.dumps(interface.to_dict())}"
    )
    for m in messages:
        print(f"\n=== {m['role']} (turn 0) ===\n{m['content']}")
    for turn in range(1, task.num_turns):
        for m in env.user_messages(turn):
            print(f"\n=== {m['role']} (turn {turn}) ===\n{m['content']}")
    return 0
